//! What the TLS rows of `tcpkit-bench load` hold equal between tcpkit and its peers: each
//! server pinned to one CPU and each client to the other (taskset; the same pinning for load,
//! dnsperf, wrk, h2load and s_time), the CPU each process spent on a run (the server's from
//! /proc, the client's from its rusage by `/usr/bin/time`), so a row says which side ran out
//! of CPU; and a rate search taken one step at a time, so that two clients' searches take
//! turns and a noisy minute falls on both.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use crate::load::Outcome;

/// The CPU the servers get, and the one the clients get.
pub(crate) const SERVER_CPU: &str = "0";
pub(crate) const CLIENT_CPU: &str = "1";

/// What `/usr/bin/time -f` prints on the client's stderr: user and system seconds.
const TIME_MARK: &str = "tcpkit-bench-cpu";
const TIME_FORMAT: &str = "tcpkit-bench-cpu %U %S";

/// CPU seconds of a run: the client's and the server's, where measured.
pub(crate) type Cpu = (Option<f64>, Option<f64>);

/// Whether this machine has the two CPUs the pinning needs (else nothing is pinned and the
/// table says so).
pub(crate) fn can_pin() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
}

/// `argv` run on the clients' CPU under `/usr/bin/time` (its CPU seconds read back by
/// [`client_cpu`]); unpinned but timed when the machine has one CPU.
pub(crate) fn client_argv<'a>(argv: &[&'a str]) -> Vec<&'a str> {
    let mut v = Vec::with_capacity(argv.len() + 6);
    if can_pin() {
        v.extend(["taskset", "-c", CLIENT_CPU]);
    }
    v.extend(["/usr/bin/time", "-f", TIME_FORMAT]);
    v.extend_from_slice(argv);
    v
}

/// The client's CPU seconds (user + system) from the line [`client_argv`]'s time printed.
pub(crate) fn client_cpu(err: &str) -> Option<f64> {
    let l = err.lines().rev().find_map(|l| l.strip_prefix(TIME_MARK))?;
    let mut it = l.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some(it.next()?? + it.next()??)
}

/// Pins every thread of `pid` and of its descendants (nginx's worker) to the servers' CPU.
pub(crate) fn pin_server(pid: u32) -> Result<()> {
    if !can_pin() {
        return Ok(());
    }
    for p in crate::load::tree(pid) {
        let o = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", SERVER_CPU, &p.to_string()])
            .output()
            .context("taskset (util-linux)")?;
        anyhow::ensure!(
            o.status.success(),
            "taskset -a -p -c {SERVER_CPU} {p}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(())
}

/// CPU seconds (user + system, all threads) that `pid` and its descendants have used so far.
pub(crate) fn cpu_s(pid: u32) -> f64 {
    // SAFETY: sysconf with a valid name has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    crate::load::tree(pid)
        .into_iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| {
            // utime and stime are fields 14 and 15; the command before them may hold spaces.
            let rest = s.rsplit_once(')')?.1;
            let mut f = rest.split_whitespace().skip(11);
            Some(f.next()?.parse::<f64>().ok()? + f.next()?.parse::<f64>().ok()?)
        })
        .sum::<f64>()
        / hz
}

/// A step's cell: the rate, the share answered, ✗ when not as asked, and the CPU µs per
/// answer of client and server when both are known (`[c 9.1 s 10.2]`).
fn step_cell(rate: u64, o: &Outcome) -> String {
    let mut s = format!(
        "{}:{:.0}%{}",
        short_rate(rate),
        o.answered as f64 * 100.0 / o.asked,
        if o.as_asked() { "" } else { "✗" }
    );
    s.push_str(&cpu_cell(o.cpu_client, o.cpu_server, o.answered));
    s
}

/// ` [c X s Y]`: the client's and the server's CPU µs per answer over a run of `answered`
/// answers; empty unless both were measured and something was answered.
pub(crate) fn cpu_cell(client: Option<f64>, server: Option<f64>, answered: u64) -> String {
    let mut s = String::new();
    if answered == 0 {
        return s;
    }
    if let (Some(c), Some(srv)) = (client, server) {
        let per = |x: f64| x * 1e6 / answered.max(1) as f64;
        let _ = write!(s, " [c {:.1} s {:.1}]", per(c), per(srv));
    }
    s
}

/// `80k`, `1.4k`, `600`: a ladder's rate, short.
pub(crate) fn short_rate(r: u64) -> String {
    if r.is_multiple_of(1000) {
        format!("{}k", r / 1000)
    } else if r >= 1000 {
        format!("{:.1}k", r as f64 / 1000.0)
    } else {
        r.to_string()
    }
}

/// A rate rounded down to whole thousands, or hundreds below 10k (at least 100).
pub(crate) fn round_rate(n: u64) -> u64 {
    let unit = if n >= 10_000 { 1000 } else { 100 };
    (n / unit * unit).max(100)
}

/// Where a search is.
#[derive(Clone, Copy)]
enum At {
    /// Going up the ladder, at its i-th rate.
    Up(usize),
    /// The ladder's first rate was not answered: down by ×0.6 from the last rate tried, this
    /// many steps taken.
    Down(u32, u64),
    /// One step halfway between the last good and the first bad rate, if there is room.
    Mid,
    Done,
}

/// The highest rate answered as asked, searched one step at a time: up `ladder` until a rate
/// is not (or, when its first rate is not, down by ×0.6 until one is, at most 4 steps), then
/// one step halfway between the last good and the first bad rate.
pub(crate) struct Search {
    ladder: Vec<u64>,
    at: At,
    good: u64,
    bad: Option<u64>,
    steps: Vec<String>,
}

impl Search {
    pub(crate) fn new(ladder: &[u64]) -> Search {
        Search {
            ladder: ladder.to_vec(),
            at: if ladder.is_empty() {
                At::Done
            } else {
                At::Up(0)
            },
            good: 0,
            bad: None,
            steps: Vec::new(),
        }
    }

    /// The next rate to run, None once the search is over.
    pub(crate) fn next(&mut self) -> Option<u64> {
        loop {
            match self.at {
                At::Up(i) => return Some(self.ladder[i]),
                At::Down(_, last) => return Some(round_rate(last * 6 / 10)),
                At::Mid => match self.bad.filter(|_| self.good > 0) {
                    Some(b) if round_rate((self.good + b) / 2) > self.good => {
                        return Some(round_rate((self.good + b) / 2))
                    }
                    _ => self.at = At::Done,
                },
                At::Done => return None,
            }
        }
    }

    /// What the run at `rate` (the one [`Search::next`] gave) did.
    pub(crate) fn record(&mut self, rate: u64, o: &Outcome) {
        self.steps.push(step_cell(rate, o));
        let ok = o.as_asked();
        if ok {
            self.good = self.good.max(rate);
        } else {
            self.bad = Some(self.bad.map_or(rate, |b| b.min(rate)));
        }
        self.at = match (self.at, ok) {
            (At::Up(i), true) if i + 1 < self.ladder.len() => At::Up(i + 1),
            (At::Up(_), true) => At::Mid,
            (At::Up(_), false) if self.good == 0 => At::Down(0, rate),
            (At::Up(_), false) => At::Mid,
            (At::Down(..), true) => At::Mid,
            (At::Down(k, _), false) if k + 1 < 4 => At::Down(k + 1, rate),
            (At::Down(..), false) => At::Mid,
            (At::Mid | At::Done, _) => At::Done,
        };
    }

    /// The highest rate answered as asked (0: none) and what each step gave.
    pub(crate) fn result(&self) -> (u64, String) {
        let mut steps = self.steps.join(" ");
        if self.bad.is_none() && self.good > 0 {
            // Every step answered: the ladder ended before the client or the server did.
            steps.push_str(" (every step answered: the limit is higher)");
        }
        (self.good, steps)
    }
}

/// Two searches taking turns, step by step (which goes first alternates), until both are
/// over: tcpkit's and its peer's, so that the machine's noise falls on both alike.
pub(crate) fn search_pair(
    (a, mut run_a): (&mut Search, impl FnMut(u64) -> Result<Outcome>),
    (b, mut run_b): (&mut Search, impl FnMut(u64) -> Result<Outcome>),
) -> Result<()> {
    let mut turn = 0;
    loop {
        let mut any = false;
        for k in 0..2 {
            if (k + turn) % 2 == 0 {
                if let Some(r) = a.next() {
                    let o = run_a(r)?;
                    a.record(r, &o);
                    any = true;
                }
            } else if let Some(r) = b.next() {
                let o = run_b(r)?;
                b.record(r, &o);
                any = true;
            }
        }
        if !any {
            return Ok(());
        }
        turn += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(answered: u64, asked: f64) -> Outcome {
        Outcome {
            answered,
            asked,
            ..Outcome::default()
        }
    }

    /// Every rate answered up to 54k, not 75k: the halfway step (64k) is tried last.
    #[test]
    fn search_goes_up_then_halfway() {
        let mut s = Search::new(&[20_000, 28_000, 39_000, 54_000, 75_000]);
        let mut tried = Vec::new();
        while let Some(r) = s.next() {
            tried.push(r);
            let ok = r <= 60_000;
            s.record(r, &outcome(if ok { r } else { r / 2 }, r as f64));
        }
        assert_eq!(tried, [20_000, 28_000, 39_000, 54_000, 75_000, 64_000]);
        assert_eq!(s.result().0, 54_000);
        assert!(
            s.result().1.starts_with("20k:100% 28k:100%"),
            "{}",
            s.result().1
        );
        assert!(s.result().1.contains("75k:50%✗"), "{}", s.result().1);
    }

    /// A first rate of 1k not answered: down in hundreds, below 1k (the old search stayed at
    /// 1k, rounding 600 up to it, and tried 1k five times: nginx's h2 handshake row).
    #[test]
    fn search_goes_below_its_first_rate() {
        let mut s = Search::new(&[1000, 1400]);
        let mut tried = Vec::new();
        while let Some(r) = s.next() {
            tried.push(r);
            s.record(r, &outcome(r.min(700), r as f64));
        }
        assert_eq!(tried, [1000, 600, 800]);
        assert_eq!(s.result().0, 600);
        assert_eq!(short_rate(1400), "1.4k");
        assert_eq!(short_rate(600), "600");
    }

    #[test]
    fn a_search_answered_throughout_says_its_limit_is_higher() {
        let mut s = Search::new(&[1000, 2000]);
        while let Some(r) = s.next() {
            s.record(r, &outcome(r, r as f64));
        }
        assert_eq!(s.result().0, 2000);
        assert!(s
            .result()
            .1
            .ends_with("(every step answered: the limit is higher)"));
    }

    #[test]
    fn searches_take_turns() {
        let (mut a, mut b) = (Search::new(&[1000, 2000]), Search::new(&[5000]));
        let log = std::cell::RefCell::new(Vec::new());
        let run = |who: &'static str| {
            let log = &log;
            move |r: u64| {
                log.borrow_mut().push((who, r));
                Ok(outcome(r, r as f64))
            }
        };
        search_pair((&mut a, run("a")), (&mut b, run("b"))).unwrap();
        assert_eq!(log.into_inner(), [("a", 1000), ("b", 5000), ("a", 2000)]);
    }

    #[test]
    fn time_line_gives_cpu_seconds() {
        let err = "warning\ntcpkit-bench-cpu 1.25 0.50\n";
        assert_eq!(client_cpu(err), Some(1.75));
        assert_eq!(client_cpu("nothing"), None);
    }
}
