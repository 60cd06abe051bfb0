//! Pictures of a run (`--plot FILE.svg`): the percentile spectrum of a latency or timing-error
//! histogram drawn as HdrHistogram's plotter and wrk2's `-U` output are read (x: the percentile
//! on the log scale of 1/(1-p), so 90 %, 99 %, 99.9 % are evenly spaced), and the same values
//! over time from per-interval [`Sample`]s kept by a bounded [`Timeline`].
//!
//! Drawn with plotters' SVG backend and no font of its own: labels are SVG `<text>` that the
//! viewer sets in its sans-serif font, so nothing here needs a font file at build or run time.

use std::path::Path;

use plotters::prelude::*;

use crate::hist::Histogram;

/// One interval of a run: how many values, and their percentiles, in ns.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Start of the interval, seconds from the run's start.
    pub t_s: f64,
    /// Its length in seconds.
    pub secs: f64,
    /// Values recorded in the interval.
    pub count: u64,
    /// Their median.
    pub p50_ns: u64,
    /// Their 99th percentile.
    pub p99_ns: u64,
    /// The largest of them.
    pub max_ns: u64,
}

impl Sample {
    /// The sample of the interval from `t_s` lasting `secs` whose values are `h`: how the
    /// timeline of an HDR log and the per-second series `merge` builds from reports' intervals
    /// become the same picture.
    pub fn of(t_s: f64, secs: f64, h: &Histogram) -> Sample {
        let p = h.percentiles();
        Sample {
            t_s,
            secs,
            count: p.count,
            p50_ns: p.p50_ns,
            p99_ns: p.p99_ns,
            max_ns: p.max_ns,
        }
    }
}

/// At most this many samples are kept: a day at one a second would be 86 400; past this the
/// timeline halves its resolution (adjacent samples merged), so memory stays bounded.
pub const MAX_SAMPLES: usize = 8192;

/// Per-interval percentiles of values recorded over a run, one [`Sample`] per interval.
/// One interval histogram, allocated once and cleared, never one per interval.
#[derive(Debug)]
pub struct Timeline {
    start_ns: u64,
    every_ns: u64,
    next_ns: u64,
    cur: Histogram,
    samples: Vec<Sample>,
}

impl Timeline {
    /// Intervals of `every_ns` from `start_ns` (absolute, the clock of [`Timeline::record`]).
    pub fn new(start_ns: u64, every_ns: u64) -> Timeline {
        let every_ns = every_ns.max(1);
        Timeline {
            start_ns,
            every_ns,
            next_ns: start_ns + every_ns,
            cur: Histogram::new(),
            samples: Vec::new(),
        }
    }

    /// Records `value_ns` observed at `now_ns`.
    #[inline]
    pub fn record(&mut self, now_ns: u64, value_ns: u64) {
        if now_ns >= self.next_ns {
            self.roll(now_ns);
        }
        self.cur.record(value_ns);
    }

    /// Closes the intervals that ended by `now_ns` (empty ones too: a pause shows as zero).
    fn roll(&mut self, now_ns: u64) {
        while now_ns >= self.next_ns {
            let from = self.next_ns - self.every_ns;
            self.push(from, self.every_ns);
            self.next_ns += self.every_ns;
        }
    }

    fn push(&mut self, from_ns: u64, len_ns: u64) {
        self.samples.push(Sample::of(
            from_ns.saturating_sub(self.start_ns) as f64 / 1e9,
            len_ns as f64 / 1e9,
            &self.cur,
        ));
        self.cur.clear();
        if self.samples.len() >= MAX_SAMPLES {
            self.halve();
        }
    }

    /// Merges adjacent samples: counts add, p99 and max take the larger, p50 the
    /// count-weighted mean (a picture's approximation, said here because it is one).
    fn halve(&mut self) {
        let merged: Vec<Sample> = self
            .samples
            .chunks(2)
            .map(|c| match c {
                [a, b] => {
                    let n = a.count + b.count;
                    let p50 = if n == 0 {
                        0
                    } else {
                        ((u128::from(a.p50_ns) * u128::from(a.count)
                            + u128::from(b.p50_ns) * u128::from(b.count))
                            / u128::from(n)) as u64
                    };
                    Sample {
                        t_s: a.t_s,
                        secs: a.secs + b.secs,
                        count: n,
                        p50_ns: p50,
                        p99_ns: a.p99_ns.max(b.p99_ns),
                        max_ns: a.max_ns.max(b.max_ns),
                    }
                }
                [a] => *a,
                _ => unreachable!("chunks(2)"),
            })
            .collect();
        self.samples = merged;
        self.every_ns *= 2;
        // The open interval keeps its start; it now ends a doubled interval later.
        let from = self.next_ns - self.every_ns / 2;
        self.next_ns = from + self.every_ns;
    }

    /// The samples, the last (partial) interval closed at `end_ns`.
    pub fn finish(mut self, end_ns: u64) -> Vec<Sample> {
        self.roll(end_ns);
        let from = self.next_ns - self.every_ns;
        if end_ns > from && self.cur.count() > 0 {
            self.push(from, end_ns - from);
        }
        self.samples
    }
}

/// The spectrum of `h`: (1/(1-p), value in ns) from p = 0 up to the last value, as
/// HdrHistogram's percentile distribution lists it (5 steps per halving of 1-p).
pub fn spectrum(h: &Histogram) -> Vec<(f64, u64)> {
    let mut pts = Vec::new();
    if h.count() == 0 {
        return pts;
    }
    for v in h.inner().iter_quantiles(5) {
        let q = v.quantile_iterated_to();
        if q >= 1.0 {
            break;
        }
        pts.push((1.0 / (1.0 - q), v.value_iterated_to()));
    }
    // The maximum, at the percentile of the last value (1 - 1/count).
    let n = h.count() as f64;
    pts.push((n.max(2.0), h.percentiles().max_ns));
    pts
}

/// A unit for ns values whose largest is `max_ns`: the one that keeps the axis readable.
fn unit(max_ns: u64) -> (&'static str, f64) {
    if max_ns >= 10_000_000_000 {
        ("s", 1e9)
    } else if max_ns >= 10_000_000 {
        ("ms", 1e6)
    } else {
        ("us", 1e3)
    }
}

/// A labelled curve: its legend text, colour and points (x, y in the panel's units).
struct Curve {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// One chart of a picture.
enum Panel {
    /// Percentile spectrum: x is 1/(1-p) on a log axis.
    Spectrum {
        title: String,
        y_desc: String,
        curves: Vec<Curve>,
    },
    /// Values over time: x in seconds from the start.
    OverTime {
        title: String,
        y_desc: String,
        curves: Vec<Curve>,
    },
}

const BLUE_: RGBColor = RGBColor(31, 119, 180);
const ORANGE_: RGBColor = RGBColor(255, 127, 14);
const GREEN_: RGBColor = RGBColor(44, 160, 44);
const RED_: RGBColor = RGBColor(214, 39, 40);

/// "99.9%" for 1/(1-p) = 1000; nothing between the powers of ten.
fn percentile_label(x: f64) -> String {
    let decade = x.log10();
    if (decade - decade.round()).abs() > 1e-6 {
        return String::new();
    }
    let d = decade.round() as i32;
    if d == 0 {
        return "0%".into();
    }
    let p = 100.0 * (1.0 - 10f64.powi(-d));
    format!("{p:.*}%", (d - 2).max(0) as usize)
}

fn draw(panels: &[Panel], title: &str) -> Result<String, String> {
    let mut svg = String::new();
    {
        let height = 380 * panels.len() as u32 + 50;
        let root = SVGBackend::with_string(&mut svg, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let root = root
            .titled(title, ("sans-serif", 24))
            .map_err(|e| e.to_string())?;
        let areas = root.split_evenly((panels.len(), 1));
        for (area, panel) in areas.iter().zip(panels) {
            match panel {
                Panel::Spectrum {
                    title,
                    y_desc,
                    curves,
                } => {
                    let xmax = curves
                        .iter()
                        .flat_map(|c| c.points.iter().map(|p| p.0))
                        .fold(100.0f64, f64::max);
                    // Up to the next power of ten, so the last percentile has its label.
                    let xmax = 10f64.powi(xmax.log10().ceil() as i32);
                    let ymax = y_top(curves);
                    let mut chart = ChartBuilder::on(area)
                        .caption(title, ("sans-serif", 18))
                        .margin(12)
                        // Room for the last percentile's label, centred on the right edge.
                        .margin_right(45)
                        .x_label_area_size(45)
                        .y_label_area_size(75)
                        .build_cartesian_2d((1f64..xmax).log_scale(), 0f64..ymax)
                        .map_err(|e| e.to_string())?;
                    chart
                        .configure_mesh()
                        .x_desc("percentile (log scale of 1/(1-p))")
                        .y_desc(y_desc.as_str())
                        .x_label_formatter(&|x| percentile_label(*x))
                        .label_style(("sans-serif", 14))
                        .draw()
                        .map_err(|e| e.to_string())?;
                    draw_curves(&mut chart, curves)?;
                }
                Panel::OverTime {
                    title,
                    y_desc,
                    curves,
                } => {
                    let xmax = curves
                        .iter()
                        .flat_map(|c| c.points.iter().map(|p| p.0))
                        .fold(1.0f64, f64::max);
                    let ymax = y_top(curves);
                    let mut chart = ChartBuilder::on(area)
                        .caption(title, ("sans-serif", 18))
                        .margin(12)
                        .x_label_area_size(45)
                        .y_label_area_size(75)
                        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
                        .map_err(|e| e.to_string())?;
                    chart
                        .configure_mesh()
                        .x_desc("time since start (s)")
                        .y_desc(y_desc.as_str())
                        .label_style(("sans-serif", 14))
                        .draw()
                        .map_err(|e| e.to_string())?;
                    draw_curves(&mut chart, curves)?;
                }
            }
        }
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

/// A little above the highest point, so no curve runs along the frame.
fn y_top(curves: &[Curve]) -> f64 {
    let m = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    if m > 0.0 {
        m * 1.1
    } else {
        1.0
    }
}

fn draw_curves<'a, X>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<X, plotters::coord::types::RangedCoordf64>,
    >,
    curves: &[Curve],
) -> Result<(), String>
where
    X: Ranged<ValueType = f64>,
{
    for c in curves {
        let color = c.color;
        chart
            .draw_series(LineSeries::new(
                c.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(c.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn spectrum_curve(h: &Histogram, label: &str, color: RGBColor, div: f64) -> Curve {
    Curve {
        label: label.into(),
        color,
        points: spectrum(h)
            .into_iter()
            .map(|(x, v)| (x, v as f64 / div))
            .collect(),
    }
}

fn time_curve(s: &[Sample], label: &str, color: RGBColor, f: impl Fn(&Sample) -> f64) -> Curve {
    Curve {
        label: label.into(),
        color,
        points: s.iter().map(|x| (x.t_s + x.secs, f(x))).collect(),
    }
}

/// The per-interval percentiles of the histograms tagged `tag` in HdrHistogram interval logs
/// (as `load --hdr-log` writes them: one line per second and thread, each process its own
/// file), merged exactly: every thread's and process's histograms of the same second are added
/// before the percentiles are taken. Only the encoded lines are held (a few hundred bytes each), and one decoded
/// histogram at a time.
pub fn timeline_from_hdr_logs(
    paths: &[std::path::PathBuf],
    tag: &str,
) -> std::io::Result<Vec<Sample>> {
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    let mut lines: Vec<(u64, u64, String)> = Vec::new();
    for p in paths {
        let bytes = std::fs::read(p)?;
        for e in IntervalLogIterator::new(&bytes) {
            let Ok(LogEntry::Interval(i)) = e else {
                continue;
            };
            if i.tag().map(|t| t.as_str()) != Some(tag) {
                continue;
            }
            // Threads and processes start their intervals at nearly the same offsets; the
            // interval index (start / length, rounded) is what they share.
            let len = (i.duration().as_millis() as u64).max(1);
            let start = i.start_timestamp().as_millis() as u64;
            lines.push((
                (start + len / 2) / len,
                len,
                i.encoded_histogram().to_string(),
            ));
        }
    }
    lines.sort_by_key(|l| l.0);
    let mut out = Vec::new();
    let mut acc = Histogram::new();
    let mut i = 0;
    while i < lines.len() {
        let (index, len) = (lines[i].0, lines[i].1);
        acc.clear();
        while i < lines.len() && lines[i].0 == index {
            let h = Histogram::from_base64(&lines[i].2)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            acc.merge(&h);
            i += 1;
        }
        out.push(Sample::of(
            (index * len) as f64 / 1e3,
            len as f64 / 1e3,
            &acc,
        ));
    }
    Ok(out)
}

/// `--plot`'s file must be named .svg: the picture is SVG (a PNG would need a rasterizer and
/// a font to draw its text with, neither of which a server host can be assumed to have, and
/// every browser shows SVG). A `.png` that holds SVG is what this refuses; the message is the
/// whole usage line, the flag first.
pub fn check_name(p: &Path) -> Result<(), String> {
    if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg")) {
        return Ok(());
    }
    let named = p.with_extension("svg");
    Err(format!(
        "--plot {}: the picture is SVG, so the file is named .svg: --plot {} (a PNG from it: rsvg-convert -o x.png {})",
        p.display(),
        named.display(),
        named.display()
    ))
}

/// Checks that `path` can be written (creating it), before a run whose picture it will hold.
pub fn check_path(path: &Path) -> std::io::Result<()> {
    std::fs::File::create(path).map(drop)
}

fn write(path: &Path, svg: Result<String, String>) -> std::io::Result<()> {
    let svg = svg.map_err(std::io::Error::other)?;
    std::fs::write(path, svg)
}

/// `load --plot`: the latency spectrum (corrected: from the intended send time;
/// uncorrected: from the actual send time), latency p50/p99 over time, and the rate achieved.
pub fn load_svg(
    path: &Path,
    title: &str,
    corrected: &Histogram,
    uncorrected: &Histogram,
    timeline: &[Sample],
) -> std::io::Result<()> {
    let top = corrected
        .percentiles()
        .max_ns
        .max(uncorrected.percentiles().max_ns)
        .max(timeline.iter().map(|s| s.p99_ns).max().unwrap_or(0));
    let (u, div) = unit(top);
    let panels = [
        Panel::Spectrum {
            title: "Latency by percentile".into(),
            y_desc: format!("latency ({u})"),
            curves: vec![
                spectrum_curve(
                    corrected,
                    "corrected (from the intended send time)",
                    BLUE_,
                    div,
                ),
                spectrum_curve(
                    uncorrected,
                    "uncorrected (from the actual send time)",
                    ORANGE_,
                    div,
                ),
            ],
        },
        Panel::OverTime {
            title: "Latency over time (from the intended send time, per interval)".into(),
            y_desc: format!("latency ({u})"),
            curves: vec![
                time_curve(timeline, "p50", BLUE_, |s| s.p50_ns as f64 / div),
                time_curve(timeline, "p99", RED_, |s| s.p99_ns as f64 / div),
            ],
        },
        Panel::OverTime {
            title: "Rate achieved (answers per second, per interval)".into(),
            y_desc: "answers per second".into(),
            curves: vec![time_curve(timeline, "answers/s", GREEN_, |s| {
                if s.secs > 0.0 {
                    s.count as f64 / s.secs
                } else {
                    0.0
                }
            })],
        },
    ];
    write(path, draw(&panels, title))
}

/// `replay --plot`: how late packets left their intended send time, as a spectrum and over
/// time.
pub fn replay_svg(
    path: &Path,
    title: &str,
    late: &Histogram,
    timeline: &[Sample],
) -> std::io::Result<()> {
    let top = late
        .percentiles()
        .max_ns
        .max(timeline.iter().map(|s| s.max_ns).max().unwrap_or(0));
    let (u, div) = unit(top);
    let panels = [
        Panel::Spectrum {
            title: "Timing error by percentile (how late packets left)".into(),
            y_desc: format!("late by ({u})"),
            curves: vec![spectrum_curve(late, "timing error", BLUE_, div)],
        },
        Panel::OverTime {
            title: "Timing error over time (per interval)".into(),
            y_desc: format!("late by ({u})"),
            curves: vec![
                time_curve(timeline, "p50", BLUE_, |s| s.p50_ns as f64 / div),
                time_curve(timeline, "p99", ORANGE_, |s| s.p99_ns as f64 / div),
                time_curve(timeline, "max", RED_, |s| s.max_ns as f64 / div),
            ],
        },
    ];
    write(path, draw(&panels, title))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_labels_are_the_nines() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(10000.0), "99.99%");
        assert_eq!(percentile_label(20.0), "");
    }

    #[test]
    fn spectrum_runs_from_p0_to_the_maximum() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 1000);
        }
        let s = spectrum(&h);
        assert!((s[0].0 - 1.0).abs() < 1e-9, "{:?}", s[0]);
        // x grows, values never fall.
        assert!(s.windows(2).all(|w| w[1].0 >= w[0].0 && w[1].1 >= w[0].1));
        // x = 100 (p99) is about 9.9 ms.
        let p99 = s.iter().find(|p| p.0 >= 100.0).unwrap();
        assert!((p99.1 as f64 - 9_900_000.0).abs() < 20_000.0, "{p99:?}");
        assert_eq!(s.last().unwrap().0, 10_000.0);
        assert!(spectrum(&Histogram::new()).is_empty());
    }

    #[test]
    fn timeline_has_a_sample_per_interval_and_stays_bounded() {
        let mut t = Timeline::new(1_000, 1_000_000_000);
        t.record(1_000 + 100, 5_000);
        t.record(1_000 + 200, 7_000);
        // Nothing in the second interval; one value in the third.
        t.record(1_000 + 2_500_000_000, 9_000);
        let s = t.finish(1_000 + 2_600_000_000);
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!((s[0].count, s[1].count, s[2].count), (2, 0, 1));
        assert_eq!(s[1].t_s, 1.0);
        assert!((s[2].secs - 0.6).abs() < 1e-9);

        let mut t = Timeline::new(0, 10);
        for i in 0..(3 * MAX_SAMPLES as u64) {
            t.record(i * 10, 1_000);
        }
        let s = t.finish(3 * MAX_SAMPLES as u64 * 10);
        assert!(s.len() <= MAX_SAMPLES, "{}", s.len());
        assert_eq!(
            s.iter().map(|x| x.count).sum::<u64>(),
            3 * MAX_SAMPLES as u64
        );
    }

    #[test]
    fn svg_names_its_series_and_axes() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 10_000);
        }
        let mut t = Timeline::new(0, 1_000_000_000);
        for i in 0..5u64 {
            t.record(i * 1_000_000_000 + 1, 2_000_000 + i * 100_000);
        }
        let tl = t.finish(5_000_000_000);
        let dir = tempfile_dir();
        let p = dir.join("load.svg");
        load_svg(&p, "tcpkit load", &h, &h, &tl).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        for s in [
            "corrected (from the intended send time)",
            "uncorrected (from the actual send time)",
            "latency (ms)",
            "99.9%",
            "answers per second",
            "time since start (s)",
        ] {
            assert!(svg.contains(s), "{s:?} not in the SVG");
        }
        if let Some(keep) = std::env::var_os("TCPKIT_PLOT_KEEP") {
            let _ = std::fs::copy(&p, keep);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn hdr_logs_of_several_threads_and_processes_merge_per_second() {
        use std::time::{Duration, SystemTime};
        let dir = tempfile_dir().join("hlog");
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("h.0"), dir.join("h.1"));
        let mut h1 = Histogram::new();
        let mut h2 = Histogram::new();
        for v in 1..=100u64 {
            h1.record(v * 1_000);
            h2.record(v * 1_000_000);
        }
        let sec = Duration::from_secs(1);
        {
            let mut la = crate::HdrLog::create(&a, SystemTime::now()).unwrap();
            la.write(&h1, Duration::ZERO, sec, "intended").unwrap();
            la.write(&h2, Duration::ZERO, sec, "sent").unwrap();
            la.write(&h1, sec, sec, "intended").unwrap();
            la.flush().unwrap();
            let mut lb = crate::HdrLog::create(&b, SystemTime::now()).unwrap();
            lb.write(&h2, Duration::ZERO, sec, "intended").unwrap();
            lb.flush().unwrap();
        }
        let s = timeline_from_hdr_logs(&[a, b], "intended").unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        // Second 0: both processes' values, 200 of them; its p99 is from the larger ones.
        assert_eq!((s[0].count, s[1].count), (200, 100));
        assert!(s[0].p99_ns > 90_000_000, "{:?}", s[0]);
        assert_eq!((s[1].t_s, s[1].secs), (1.0, 1.0));
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tcpkit-plot-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
