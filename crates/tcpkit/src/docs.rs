//! `tcpkit completions SHELL` and `tcpkit man DIR`: shell completions and man pages generated
//! from the clap definitions, so they say exactly what `--help` says.

use std::path::PathBuf;

use clap::Command;
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
    /// Directory to write the pages into (created if missing), e.g. /usr/local/share/man/man1.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

pub fn completions(a: CompletionsArgs, mut cmd: Command) -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "tcpkit", &mut out);
    crate::common::print(&String::from_utf8_lossy(&out));
    Ok(())
}

pub fn man(a: ManArgs, cmd: Command) -> Result<(), Failure> {
    let fail = |what: String, e: std::io::Error| Failure::Runtime(format!("{what}: {e}"));
    std::fs::create_dir_all(&a.dir).map_err(|e| fail(a.dir.display().to_string(), e))?;
    // One page for the tool, one per subcommand named as git names its own (tcpkit-replay.1).
    let cmd = cmd.version(env!("CARGO_PKG_VERSION"));
    let mut pages = vec![("tcpkit".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands() {
        // clap names are &'static str; this process ends right after writing the pages.
        let name: &'static str = Box::leak(format!("tcpkit-{}", sub.get_name()).into_boxed_str());
        pages.push((name.to_string(), sub.clone().name(name)));
    }
    for (name, page) in pages {
        let path = a.dir.join(format!("{name}.1"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut buf)
            .map_err(|e| fail(format!("render {name}.1"), e))?;
        std::fs::write(&path, buf).map_err(|e| fail(path.display().to_string(), e))?;
    }
    Ok(())
}
