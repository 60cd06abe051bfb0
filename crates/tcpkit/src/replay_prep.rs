//! `tcpkit replay prep`: tcpprep's command line (its flag names and short letters, so a
//! tcpprep line works with `tcpprep` replaced by `tcpkit replay prep`), resolved into
//! `tcpkit_replay::prep`'s options; the cache it writes is tcpprep 4.4.3's byte for byte.

use std::path::PathBuf;

use clap::{ArgGroup, Args, Subcommand};
use tcpkit_replay::prep::{self, AutoMode, PrepCidr, PrepMode, PrepOptions};

use crate::Failure;

#[derive(Debug, Subcommand)]
pub enum ReplayCmd {
    /// Write a tcpprep cache: which interface each packet of a capture leaves by when replayed
    /// with --intf1/--intf2 (tcpprep 4.4.3's modes and file, byte for byte). Example:
    /// tcpkit replay prep --auto=bridge -i in.pcap -o in.cache
    Prep(Box<PrepArgs>),
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("mode").args(["auto", "cidr", "port"])))]
pub struct PrepArgs {
    /// Split by what each host does (bridge, router, client, server, first). A host is a
    /// server when it sends at least --ratio times as many SYN-ACKs, DNS answers and ICMP
    /// port-unreachables as SYNs and DNS queries, a client otherwise; hosts with none of these
    /// are unknown: client in client and router modes, server in server and bridge modes.
    /// first: a host first seen as a source is a client, as a destination a server. router
    /// fails, as tcpprep does, when the lowest host in tcpprep's tree order is a client.
    #[arg(short = 'a', long, value_name = "MODE", value_parser = ["bridge", "router", "client", "server", "first"])]
    pub auto: Option<String>,

    /// Packets whose source is in one of these networks go out of the primary side (--intf1),
    /// the others out of the secondary (tcpprep's code; its help says "servers").
    /// Example: --cidr=10.0.0.0/8,[fd00::/8]
    #[arg(short = 'c', long, value_name = "CIDR,...")]
    pub cidr: Option<String>,

    /// TCP and UDP packets to a destination port below 1024 go out of the primary side, the
    /// others out of the secondary; other IP protocols go as non-IP packets do.
    #[arg(short = 'p', long)]
    pub port: bool,

    /// The capture to read (pcap or pcapng; Ethernet, raw IP or Linux cooked).
    #[arg(
        short = 'i',
        long = "pcap",
        value_name = "PCAP",
        required_unless_present = "print_comment"
    )]
    pub pcap: Option<PathBuf>,

    /// The cache file to write.
    #[arg(
        short = 'o',
        long = "cachefile",
        value_name = "FILE",
        required_unless_present = "print_comment"
    )]
    pub cachefile: Option<PathBuf>,

    /// A comment stored in the cache after the arguments (tcpprep -C).
    #[arg(short = 'C', long, value_name = "TEXT")]
    pub comment: Option<String>,

    /// Do not store the command's arguments in the cache's comment.
    #[arg(long)]
    pub no_arg_comment: bool,

    /// With --cidr: the networks name the secondary side instead.
    #[arg(long)]
    pub reverse: bool,

    /// Send non-IP packets (and, in port mode, IP protocols without ports) out of the primary
    /// side instead of the secondary; in router mode, unknown hosts then go secondary.
    #[arg(short = 'N', long)]
    pub nonip: bool,

    /// With --auto: server packets needed per client packet for a host to be a server
    /// (default 2.0).
    #[arg(short = 'R', long, value_name = "R")]
    pub ratio: Option<f64>,

    /// With --auto: tcpprep's shortest network mask (default 30). Checked as tcpprep checks it
    /// (0 to 32, above --maxmask); in 4.4.3 it changes nothing in the cache.
    #[arg(short = 'm', long, value_name = "N")]
    pub minmask: Option<u8>,

    /// With --auto: tcpprep's longest network mask (default 8); as --minmask.
    #[arg(short = 'M', long, value_name = "N")]
    pub maxmask: Option<u8>,

    /// Print the comment stored in a cache file and how many packets it covers, and exit.
    #[arg(short = 'P', long, value_name = "FILE", exclusive = true)]
    pub print_comment: Option<PathBuf>,
}

/// The command line after `prep`, for the comment tcpprep stores (its own argv after the
/// program name).
pub fn raw_args() -> Vec<String> {
    std::env::args()
        .skip_while(|a| a != "prep")
        .skip(1)
        .collect()
}

/// Every check that involves more than one flag, or a value's meaning.
pub fn resolve(a: &PrepArgs, raw: &[String]) -> Result<PrepOptions, Failure> {
    let mode = if let Some(m) = &a.auto {
        PrepMode::Auto(AutoMode::parse(m).ok_or_else(|| {
            Failure::Usage(format!(
                "--auto {m}: one of bridge, router, client, server, first"
            ))
        })?)
    } else if let Some(c) = &a.cidr {
        PrepMode::Cidr(PrepCidr::parse_list(c).map_err(|e| Failure::Usage(format!("--cidr {e}")))?)
    } else if a.port {
        PrepMode::Port
    } else {
        return Err(Failure::Usage(
            "give a mode: --auto MODE, --cidr LIST or --port (as tcpprep)".into(),
        ));
    };
    if a.auto.is_none() {
        for (flag, given) in [
            ("--ratio", a.ratio.is_some()),
            ("--minmask", a.minmask.is_some()),
            ("--maxmask", a.maxmask.is_some()),
        ] {
            if given {
                return Err(Failure::Usage(format!("{flag} needs --auto")));
            }
        }
    }
    let ratio = a.ratio.unwrap_or(2.0);
    if !ratio.is_finite() || ratio < 0.0 {
        return Err(Failure::Usage(format!(
            "--ratio {ratio}: must be a non-negative number"
        )));
    }
    let (min, max) = (a.minmask.unwrap_or(30), a.maxmask.unwrap_or(8));
    if min > 32 || max > 32 || min <= max {
        return Err(Failure::Usage(format!(
            "--minmask {min} --maxmask {max}: each 0 to 32, and --minmask above --maxmask (tcpprep's rule)"
        )));
    }
    if let Some(c) = &a.comment {
        if c.len() > prep::MAX_USER_COMMENT {
            return Err(Failure::Usage(format!(
                "--comment: {} bytes, over the {} a cache holds",
                c.len(),
                prep::MAX_USER_COMMENT
            )));
        }
    }
    let mut o = PrepOptions::new(mode);
    o.reverse = a.reverse;
    o.nonip = a.nonip;
    o.ratio = ratio;
    o.comment = prep::prep_comment(raw, a.comment.as_deref(), a.no_arg_comment);
    Ok(o)
}

pub fn main(a: &PrepArgs, raw: &[String]) -> Result<(), Failure> {
    if let Some(p) = &a.print_comment {
        let c = prep::PrepCache::read(p).map_err(Failure::Usage)?;
        crate::common::print(&format!(
            "tcpprep args: {}\nCache contains data for {} packets\n",
            String::from_utf8_lossy(c.comment()),
            c.packets()
        ));
        return Ok(());
    }
    let opts = resolve(a, raw)?;
    let (Some(input), Some(out)) = (&a.pcap, &a.cachefile) else {
        return Err(Failure::Usage("give -i PCAP and -o FILE".into()));
    };
    let file = prep::CaptureFile::open(input)
        .map_err(|e| Failure::Usage(format!("-i {}", crate::chain(&e))))?;
    let cache = prep::prep(&file, &opts).map_err(|e| Failure::Runtime(crate::chain(&e)))?;
    let mut bytes = Vec::new();
    cache
        .emit(&mut bytes)
        .map_err(|e| Failure::Usage(format!("-o {}: {e}", out.display())))?;
    std::fs::write(out, &bytes)
        .map_err(|e| Failure::Runtime(format!("-o {}: cannot write: {e}", out.display())))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(v: &[&str]) -> Result<PrepOptions, String> {
        let mut all = vec!["replay", "prep"];
        all.extend_from_slice(v);
        let a = crate::replay::Args::try_parse_from(all).map_err(|e| e.to_string())?;
        let Some(ReplayCmd::Prep(p)) = a.cmd else {
            return Err("no prep".into());
        };
        let raw: Vec<String> = v.iter().map(|s| s.to_string()).collect();
        resolve(&p, &raw).map_err(|f| match f {
            Failure::Usage(m) | Failure::Runtime(m) => m,
        })
    }

    /// Issue 28: tcpprep's flags, its short letters and `--flag=value` forms, parse.
    #[test]
    fn tcpprep_flags_parse() {
        let o = parse(&["--auto=bridge", "-i", "a.pcap", "-o", "a.cache"]).unwrap();
        assert_eq!(o.mode, PrepMode::Auto(AutoMode::Bridge));
        assert_eq!(o.comment, b"--auto=bridge -i a.pcap -o a.cache");
        let o = parse(&[
            "-a", "router", "-R", "3", "-N", "-i", "a", "-o", "b", "-C", "hi",
        ])
        .unwrap();
        assert_eq!(o.mode, PrepMode::Auto(AutoMode::Router));
        assert!(o.nonip && o.ratio == 3.0);
        assert_eq!(o.comment, b"-a router -R 3 -N -i a -o b\nhi");
        let o = parse(&["--cidr=10.0.0.0/8", "--reverse", "-i", "a", "-o", "b"]).unwrap();
        assert!(matches!(o.mode, PrepMode::Cidr(ref v) if v.len() == 1) && o.reverse);
        let o = parse(&["-p", "--no-arg-comment", "-i", "a", "-o", "b"]).unwrap();
        assert_eq!((o.mode, o.comment), (PrepMode::Port, Vec::new()));
        // A mode is required, one only; --ratio needs --auto; masks as tcpprep checks them.
        assert!(parse(&["-i", "a", "-o", "b"]).is_err());
        assert!(parse(&["-p", "-a", "client", "-i", "a", "-o", "b"]).is_err());
        assert_eq!(
            parse(&["-p", "-R", "2", "-i", "a", "-o", "b"]).unwrap_err(),
            "--ratio needs --auto"
        );
        assert!(parse(&["-a", "nope", "-i", "a", "-o", "b"]).is_err());
        assert!(parse(&["-a", "client", "-m", "8", "-i", "a", "-o", "b"])
            .unwrap_err()
            .contains("--minmask 8 --maxmask 8"));
        assert!(parse(&["--cidr", "10.0.0.0/40", "-i", "a", "-o", "b"])
            .unwrap_err()
            .starts_with("--cidr"));
        // -P needs nothing else and takes nothing else.
        let a = crate::replay::Args::try_parse_from(["replay", "prep", "-P", "x.cache"]).unwrap();
        assert!(matches!(a.cmd, Some(ReplayCmd::Prep(ref p)) if p.print_comment.is_some()));
    }
}
