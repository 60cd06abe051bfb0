//! `tcpkit completions SHELL` and `tcpkit man DIR`: shell completions and man pages generated
//! from the clap definitions, so they say exactly what `--help` says.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};
use clap_complete::Shell;

use crate::common::Failure;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell.
    #[arg(value_name = "SHELL")]
    pub shell: Shell,
}

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// A man directory (created if missing), e.g. /usr/local/share/man: the pages go to
    /// DIR/man1/, where `man` looks (or into DIR itself when it is already named man1).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// The value name every interface flag gives its value: completion lists interfaces for it.
const IFACE: &str = "IFACE";

pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "tcpkit", &mut out);
    let script = String::from_utf8_lossy(&out).into_owned();
    cmd.build();
    let mut flags = Vec::new();
    iface_flags(&cmd, "tcpkit", &mut flags);
    let script = match a.shell {
        Shell::Bash => bash_interfaces(&script, &flags),
        // zsh names the value in each spec, and has the function that lists interfaces.
        Shell::Zsh => script.replace(
            &format!("]:{IFACE}:_default'"),
            &format!("]:{IFACE}:_net_interfaces'"),
        ),
        Shell::Fish => fish_interfaces(&script, &flags),
        _ => script,
    };
    crate::common::print(&script);
    Ok(())
}

/// Every interface flag (value name [`IFACE`]) under `cmd`, with the name clap_complete's bash
/// script gives its subcommand (`tcpkit__subcmd__replay`).
fn iface_flags(cmd: &Command, path: &str, out: &mut Vec<(String, String)>) {
    for a in cmd.get_arguments() {
        if a.get_value_names()
            .is_some_and(|v| v.iter().any(|n| n == IFACE))
        {
            let longs = a.get_long().map(|l| format!("--{l}"));
            let shorts = a.get_short().map(|s| format!("-{s}"));
            for f in longs.into_iter().chain(shorts) {
                out.push((path.to_string(), f));
            }
        }
    }
    for sub in cmd.get_subcommands() {
        iface_flags(sub, &format!("{path}__subcmd__{}", sub.get_name()), out);
    }
}

/// clap_complete's bash script with the file completion of each interface flag replaced by
/// the interfaces this host has (/sys/class/net, the shell's own network namespace); never
/// files, even when no name matches.
fn bash_interfaces(script: &str, flags: &[(String, String)]) -> String {
    const FILES: &str = "COMPREPLY=($(compgen -f \"${cur}\"))";
    const IFACES: &str = "compopt +o default +o bashdefault 2>/dev/null || :; COMPREPLY=($(compgen -W \"$(cd /sys/class/net 2>/dev/null && printf '%s ' *)\" -- \"${cur}\"))";
    let mut out = String::with_capacity(script.len() + 256);
    let mut block = "";
    let mut flag_case = false;
    for line in script.lines() {
        let trimmed = line.trim();
        if line.starts_with("        ") && !line.starts_with("         ") && trimmed.ends_with(')')
        {
            // `        tcpkit__subcmd__replay)`: a subcommand's block begins.
            block = trimmed.trim_end_matches(')');
        } else if line.starts_with("                ") && !line.starts_with("                 ") {
            // `                --intf1)`: a case for the word before the cursor.
            let word = trimmed.trim_end_matches(')');
            flag_case = flags.iter().any(|(b, f)| b == block && f == word);
        }
        if flag_case && trimmed == FILES {
            out.push_str(&line.replace(FILES, IFACES));
            flag_case = false;
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    out
}

/// clap_complete's fish script with each interface flag of a subcommand completing the
/// interfaces fish lists (`__fish_print_interfaces`), never files.
fn fish_interfaces(script: &str, flags: &[(String, String)]) -> String {
    let mut out = String::with_capacity(script.len() + 256);
    for line in script.lines() {
        out.push_str(line);
        let iface = flags.iter().any(|(path, flag)| {
            let sub = path.strip_prefix("tcpkit__subcmd__").unwrap_or(path);
            let long = flag.strip_prefix("--").map(|l| format!(" -l {l} "));
            line.starts_with(&format!(
                "complete -c tcpkit -n \"__fish_tcpkit_using_subcommand {sub}\" "
            )) && long.is_some_and(|l| line.contains(&l))
        });
        if iface && line.ends_with(" -r") {
            out.push_str(" -f -a \"(__fish_print_interfaces)\"");
        }
        out.push('\n');
    }
    out
}

/// `text` escaped for roff: a backslash printed as itself, a hyphen as a hyphen (not the
/// typographic dash groff would make of it; options must be copyable).
fn roff(text: &str) -> String {
    text.replace('\\', "\\e").replace('-', "\\-")
}

/// `[-i|--intf1 IFACE]`: an option with its value names, in roff. An unbreakable space keeps
/// the value on the option's line.
fn synopsis_option(a: &Arg) -> Option<String> {
    let flag = match (a.get_short(), a.get_long()) {
        (Some(s), Some(l)) => format!(
            "\\fB\\-{}\\fR|\\fB\\-\\-{}\\fR",
            roff(&s.to_string()),
            roff(l)
        ),
        (Some(s), None) => format!("\\fB\\-{}\\fR", roff(&s.to_string())),
        (None, Some(l)) => format!("\\fB\\-\\-{}\\fR", roff(l)),
        (None, None) => return None,
    };
    let takes = a.get_num_args().is_some_and(|n| n.takes_values());
    let value = match (takes, a.get_value_names()) {
        (true, Some(names)) => {
            let v: Vec<String> = names
                .iter()
                .map(|n| format!("\\fI{}\\fR", roff(n)))
                .collect();
            let v = v.join("\\ ");
            if a.get_num_args().is_some_and(|n| n.min_values() == 0) {
                format!("[={v}]")
            } else {
                format!("\\ {v}")
            }
        }
        (true, None) => format!("\\ \\fI{}\\fR", roff(&a.get_id().as_str().to_uppercase())),
        _ => String::new(),
    };
    let (l, r) = if a.is_required_set() {
        ("<", ">")
    } else {
        ("[", "]")
    };
    let more = if matches!(a.get_action(), ArgAction::Append | ArgAction::Count) {
        "..."
    } else {
        ""
    };
    Some(format!("{l}{flag}{value}{r}{more}"))
}

/// The SYNOPSIS section's line for `cmd`: every visible option with its value, then the
/// arguments, then the subcommand.
fn synopsis(cmd: &Command) -> String {
    let name = cmd.get_bin_name().unwrap_or_else(|| cmd.get_name());
    let mut parts = vec![format!("\\fB{}\\fR", roff(name))];
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        if a.is_positional() {
            continue;
        }
        parts.extend(synopsis_option(a));
    }
    for p in cmd.get_positionals().filter(|a| !a.is_hide_set()) {
        let name = p
            .get_value_names()
            .map(|v| v.join(" "))
            .unwrap_or_else(|| p.get_id().as_str().to_uppercase());
        let (l, r) = if p.is_required_set() {
            ("<", ">")
        } else {
            ("[", "]")
        };
        let more = if p.get_num_args().is_some_and(|n| n.max_values() > 1) {
            "..."
        } else {
            ""
        };
        let lead = if p.is_last_set() { "\\-\\- " } else { "" };
        parts.push(format!("{lead}{l}\\fI{}\\fR{r}{more}", roff(&name)));
    }
    if cmd.has_subcommands() {
        let (l, r) = if cmd.is_subcommand_required_set() {
            ("<", ">")
        } else {
            ("[", "]")
        };
        parts.push(format!("{l}\\fICOMMAND\\fR{r}"));
    }
    parts.join(" ")
}

/// `cmd` and every subcommand at every depth, with no `help` subcommand anywhere (`--help`
/// says it all, and a page for it would be one more to install).
fn without_help_subcommands(cmd: Command) -> Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let mut cmd = cmd.disable_help_subcommand(true);
    for n in names {
        cmd = cmd.mut_subcommand(n, without_help_subcommands);
    }
    cmd
}

/// One page: clap_mangen's, with a SYNOPSIS that names each option's value.
fn page(cmd: &Command, version: &str) -> Result<Vec<u8>, std::io::Error> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .source(format!("tcpkit {version}"))
        .render(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let Some(start) = text.find(".SH SYNOPSIS\n") else {
        return Ok(buf);
    };
    let body = start + ".SH SYNOPSIS\n".len();
    let end = text[body..]
        .find("\n.SH ")
        .map_or(text.len(), |i| body + i + 1);
    let mut out = String::with_capacity(text.len() + 512);
    out.push_str(&text[..body]);
    let _ = writeln!(out, "{}", synopsis(cmd));
    out.push_str(&text[end..]);
    Ok(out.into_bytes())
}

/// Every page under `cmd` (built): itself, then its subcommands', depth first.
fn all_pages(cmd: &Command, out: &mut Vec<Command>) {
    out.push(cmd.clone());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        all_pages(sub, out);
    }
}

/// Where the pages go: DIR/man1, unless DIR is a man1 directory already.
fn man1(dir: &Path) -> PathBuf {
    if dir.file_name().is_some_and(|n| n == "man1") {
        dir.to_path_buf()
    } else {
        dir.join("man1")
    }
}

pub fn man(a: ManArgs, cmd: Command) -> Result<(), Failure> {
    let dir = man1(&a.dir);
    // The directory named cannot be used as given: a usage error, as for any file named.
    std::fs::create_dir_all(&dir).map_err(|e| Failure::Usage(format!("{}: {e}", dir.display())))?;
    let version = env!("CARGO_PKG_VERSION");
    let mut cmd = without_help_subcommands(cmd.version(version));
    // Builds the names pages go by: tcpkit-balance-run, as the pages that list it say.
    cmd.build();
    let mut pages = Vec::new();
    all_pages(&cmd, &mut pages);
    for p in pages {
        let name = p
            .get_display_name()
            .unwrap_or_else(|| p.get_name())
            .to_string();
        let path = dir.join(format!("{name}.1"));
        let fail = |e: std::io::Error| Failure::Runtime(format!("{}: {e}", path.display()));
        let bytes = page(&p, version).map_err(fail)?;
        std::fs::write(&path, bytes).map_err(fail)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pages_go_under_man1_unless_dir_is_man1() {
        assert_eq!(man1(Path::new("/x/man")), Path::new("/x/man/man1"));
        assert_eq!(man1(Path::new("/x/man/man1")), Path::new("/x/man/man1"));
        assert_eq!(man1(Path::new("pages")), Path::new("pages/man1"));
    }

    #[test]
    fn a_synopsis_names_every_value() {
        let mut cmd = Command::new("t")
            .arg(
                Arg::new("intf")
                    .short('i')
                    .long("intf1")
                    .value_name("IFACE"),
            )
            .arg(Arg::new("json").long("json").action(ArgAction::SetTrue))
            .arg(
                Arg::new("listen")
                    .long("listen")
                    .value_name("ADDR")
                    .action(ArgAction::Append),
            )
            .arg(
                Arg::new("config")
                    .long("config")
                    .value_name("FILE")
                    .required(true),
            )
            .arg(Arg::new("files").value_name("PCAP").num_args(1..));
        cmd.build();
        assert_eq!(
            synopsis(&cmd),
            "\\fBt\\fR [\\fB\\-i\\fR|\\fB\\-\\-intf1\\fR\\ \\fIIFACE\\fR] [\\fB\\-\\-json\\fR] \
             [\\fB\\-\\-listen\\fR\\ \\fIADDR\\fR]... <\\fB\\-\\-config\\fR\\ \\fIFILE\\fR> \
             [\\fB\\-h\\fR|\\fB\\-\\-help\\fR] [\\fIPCAP\\fR]..."
        );
    }

    #[test]
    fn fish_completes_interface_flags_with_interfaces() {
        let script = "complete -c tcpkit -n \"__fish_tcpkit_using_subcommand replay\" -s i -l intf1 -d 'Interface' -r\n\
                      complete -c tcpkit -n \"__fish_tcpkit_using_subcommand replay\" -s w -l write -d 'File' -r\n\
                      complete -c tcpkit -n \"__fish_tcpkit_using_subcommand mpcat\" -s i -l intf1 -d 'x' -r\n";
        let out = fish_interfaces(
            script,
            &[("tcpkit__subcmd__replay".into(), "--intf1".into())],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].ends_with(" -r -f -a \"(__fish_print_interfaces)\""),
            "{out}"
        );
        assert!(lines[1].ends_with("'File' -r"), "{out}");
        assert!(lines[2].ends_with("'x' -r"), "{out}");
    }

    #[test]
    fn only_interface_flags_of_their_own_subcommand_complete_interfaces() {
        let script = "        t__subcmd__a)\n            case \"${prev}\" in\n                -i)\n                    COMPREPLY=($(compgen -f \"${cur}\"))\n                    return 0\n                    ;;\n        t__subcmd__b)\n            case \"${prev}\" in\n                -i)\n                    COMPREPLY=($(compgen -f \"${cur}\"))\n";
        let out = bash_interfaces(script, &[("t__subcmd__a".into(), "-i".into())]);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[3].contains("/sys/class/net"), "{out}");
        assert!(
            lines[9].ends_with("COMPREPLY=($(compgen -f \"${cur}\"))"),
            "{out}"
        );
    }
}
