//! The soak's picture: per role, RSS and open descriptors of each of its processes over time
//! (the warm-up marked), drawn with plotters' SVG backend as tcpkit-stats draws its plots
//! (labels are SVG text in the viewer's sans-serif; no font file needed).

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::Series;

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// One SVG: a row per role, RSS (MiB) on the left and descriptors on the right.
pub(crate) fn svg(series: &[Series], warm_s: f64) -> Result<String> {
    let mut roles: Vec<&str> = Vec::new();
    for s in series {
        if !roles.contains(&s.role) {
            roles.push(s.role);
        }
    }
    let mut out = String::new();
    {
        let rows = roles.len().max(1);
        let root =
            SVGBackend::with_string(&mut out, (1400, 340 * rows as u32 + 50)).into_drawing_area();
        let e = |e: &dyn std::fmt::Display| anyhow!("plot: {e}");
        root.fill(&WHITE).map_err(|x| e(&x))?;
        let root = root
            .titled(
                "tcpkit-bench soak: RSS and descriptors per process (dashed: end of warm-up)",
                ("sans-serif", 22),
            )
            .map_err(|x| e(&x))?;
        let areas = root.split_evenly((rows, 2));
        for (i, role) in roles.iter().enumerate() {
            let mine: Vec<&Series> = series.iter().filter(|s| s.role == *role).collect();
            let xmax = mine
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.t))
                .fold(1.0f64, f64::max);
            for (col, (what, f)) in [
                (
                    "RSS (MiB)",
                    &(|p: &super::Point| p.rss_kib as f64 / 1024.0)
                        as &dyn Fn(&super::Point) -> f64,
                ),
                ("open descriptors", &|p: &super::Point| p.fds as f64),
            ]
            .into_iter()
            .enumerate()
            {
                let ymax = mine
                    .iter()
                    .flat_map(|s| s.points.iter().map(f))
                    .fold(0.0f64, f64::max)
                    .max(1.0)
                    * 1.15;
                let mut chart = ChartBuilder::on(&areas[i * 2 + col])
                    .caption(format!("{role}: {what}"), ("sans-serif", 17))
                    .margin(10)
                    .x_label_area_size(35)
                    .y_label_area_size(70)
                    .build_cartesian_2d(0f64..xmax, 0f64..ymax)
                    .map_err(|x| e(&x))?;
                chart
                    .configure_mesh()
                    .x_desc("seconds")
                    .y_desc(what)
                    .label_style(("sans-serif", 13))
                    .draw()
                    .map_err(|x| e(&x))?;
                chart
                    .draw_series(DashedLineSeries::new(
                        [(warm_s, 0.0), (warm_s, ymax)],
                        6,
                        4,
                        BLACK.mix(0.5).stroke_width(1),
                    ))
                    .map_err(|x| e(&x))?;
                for (k, s) in mine.iter().enumerate() {
                    let c = PALETTE[k % PALETTE.len()];
                    chart
                        .draw_series(LineSeries::new(
                            s.points.iter().map(|p| (p.t, f(p))),
                            c.stroke_width(2),
                        ))
                        .map_err(|x| e(&x))?
                        .label(s.label.as_str())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                        });
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::LowerRight)
                    .label_font(("sans-serif", 12))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|x| e(&x))?;
            }
        }
        root.present().map_err(|x| e(&x))?;
    }
    Ok(out)
}
