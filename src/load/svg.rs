//! `latency.svg`: a hand-written SVG picture of turn latency (no plotting crate).
//!
//! Two panels, one colour per series (engine, direct): on top a percentile plot — latency on a
//! logarithmic axis against the percentile on a "nines" axis (0 %, 90 %, 99 %, 99.9 %, …: the
//! position is `−log10(1 − p)`, so the tail gets the room it deserves); below, a histogram of the
//! same latencies in logarithmic bins, as the share of each series' turns. Both panels share the
//! latency decades, carry labelled axes and a legend, and open in any browser.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// One line of the picture.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    /// Legend text.
    pub name: &'a str,
    /// Stroke and fill colour.
    pub color: &'a str,
    /// Latencies in nanoseconds.
    pub hist: &'a Histogram<u64>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 800.0;
const LEFT: f64 = 100.0;
const RIGHT: f64 = 920.0;
const TOP1: f64 = 80.0;
const BOTTOM1: f64 = 400.0;
const TOP2: f64 = 490.0;
const BOTTOM2: f64 = 730.0;
const BINS: usize = 48;

/// Escapes text for XML content and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A decade as a label: 1 µs, 10 µs, 100 µs, 1 ms, …
fn decade_label(exp: i32) -> String {
    let us = 10f64.powi(exp);
    if us < 1.0 {
        format!("{} ns", (us * 1000.0).round())
    } else if us < 1000.0 {
        format!("{us} µs")
    } else if us < 1e6 {
        format!("{} ms", us / 1000.0)
    } else {
        format!("{} s", us / 1e6)
    }
}

fn nines_label(n: u32) -> String {
    match n {
        0 => "0 %".into(),
        1 => "90 %".into(),
        _ => format!("99.{} %", "9".repeat(n as usize - 2)),
    }
    .replace("99. %", "99 %")
}

/// The picture. `title` heads it; an empty series list gives a picture that says so.
pub fn latency_svg(title: &str, series: &[Series<'_>]) -> String {
    let series: Vec<Series<'_>> = series
        .iter()
        .copied()
        .filter(|s| !s.hist.is_empty())
        .collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="30" text-anchor="middle" font-size="16" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        esc(title)
    );
    if series.is_empty() {
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">no turns were recorded</text>"#,
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        out.push_str("</svg>\n");
        return out;
    }

    // Latency decades shared by both panels (µs, log10).
    let min_us = series
        .iter()
        .map(|s| s.hist.min().max(1) as f64 / 1000.0)
        .fold(f64::INFINITY, f64::min);
    let max_us = series
        .iter()
        .map(|s| s.hist.max().max(1) as f64 / 1000.0)
        .fold(0.0, f64::max);
    let lo = min_us.log10().floor() as i32;
    let hi = (max_us.log10().ceil() as i32).max(lo + 1);
    let (lo_f, hi_f) = (f64::from(lo), f64::from(hi));

    // Percentile panel.
    let most = series.iter().map(|s| s.hist.len()).max().unwrap_or(1);
    let nines = ((most as f64).log10().floor() as u32).clamp(1, 5);
    let x_of = |n: f64| LEFT + (RIGHT - LEFT) * n / f64::from(nines);
    let y1_of = |us: f64| {
        let t = (us.max(1e-3).log10() - lo_f) / (hi_f - lo_f);
        BOTTOM1 - (BOTTOM1 - TOP1) * t.clamp(0.0, 1.0)
    };
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14">Turn latency by percentile</text>"#,
        (LEFT + RIGHT) / 2.0,
        TOP1 - 12.0
    );
    frame(&mut out, TOP1, BOTTOM1);
    for exp in lo..=hi {
        let y = y1_of(10f64.powi(exp));
        grid_y(&mut out, y, &decade_label(exp));
    }
    for n in 0..=nines {
        let x = x_of(f64::from(n));
        grid_x(&mut out, x, TOP1, BOTTOM1, &nines_label(n));
    }
    let median = x_of(2f64.log10());
    let _ = writeln!(
        out,
        r##"<line x1="{median:.1}" y1="{TOP1}" x2="{median:.1}" y2="{BOTTOM1}" stroke="#ddd" stroke-dasharray="4 3"/><text x="{median:.1}" y="{}" text-anchor="middle" fill="#666">50 %</text>"##,
        BOTTOM1 + 18.0
    );
    axis_titles(
        &mut out,
        BOTTOM1,
        "percentile (log scale of nines)",
        "turn latency (log)",
    );
    for s in &series {
        let steps = 240;
        let mut points = String::new();
        for i in 0..=steps {
            let n = f64::from(nines) * f64::from(i) / f64::from(steps);
            let q = (1.0 - 10f64.powf(-n)).clamp(0.0, 1.0);
            let us = s.hist.value_at_quantile(q) as f64 / 1000.0;
            let _ = write!(points, "{:.1},{:.1} ", x_of(n), y1_of(us));
        }
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
            esc(s.color),
            points.trim_end()
        );
    }

    // Histogram panel.
    let xb_of = |log_us: f64| LEFT + (RIGHT - LEFT) * (log_us - lo_f) / (hi_f - lo_f);
    let mut shares: Vec<[f64; BINS]> = Vec::new();
    for s in &series {
        let mut bins = [0.0f64; BINS];
        let total = s.hist.len().max(1) as f64;
        for v in s.hist.iter_recorded() {
            let us = (v.value_iterated_to().max(1) as f64) / 1000.0;
            let t = (us.log10() - lo_f) / (hi_f - lo_f);
            let b = ((t * BINS as f64).floor().max(0.0) as usize).min(BINS - 1);
            bins[b] += v.count_at_value() as f64 / total * 100.0;
        }
        shares.push(bins);
    }
    let top_share = shares
        .iter()
        .flat_map(|b| b.iter().copied())
        .fold(0.0, f64::max);
    let y_max = nice_ceiling(top_share.max(1.0));
    let y2_of = |pct: f64| BOTTOM2 - (BOTTOM2 - TOP2) * (pct / y_max).clamp(0.0, 1.0);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle" font-size="14">Turn latency histogram</text>"#,
        (LEFT + RIGHT) / 2.0,
        TOP2 - 12.0
    );
    frame(&mut out, TOP2, BOTTOM2);
    for i in 0..=4 {
        let pct = y_max * f64::from(i) / 4.0;
        grid_y(&mut out, y2_of(pct), &format!("{pct:.0} %"));
    }
    for exp in lo..=hi {
        grid_x(
            &mut out,
            xb_of(f64::from(exp)),
            TOP2,
            BOTTOM2,
            &decade_label(exp),
        );
    }
    axis_titles(&mut out, BOTTOM2, "turn latency (log)", "share of turns");
    let bin_w = (RIGHT - LEFT) / BINS as f64;
    let bar_w = bin_w / series.len() as f64;
    for (k, (s, bins)) in series.iter().zip(&shares).enumerate() {
        for (b, pct) in bins.iter().enumerate() {
            if *pct <= 0.0 {
                continue;
            }
            let x = LEFT + bin_w * b as f64 + bar_w * k as f64;
            let y = y2_of(*pct);
            let _ = writeln!(
                out,
                r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="0.8"><title>{}: {pct:.2} %</title></rect>"#,
                (bar_w - 0.5).max(0.5),
                BOTTOM2 - y,
                esc(s.color),
                esc(s.name)
            );
        }
    }

    // Legend.
    for (k, s) in series.iter().enumerate() {
        let y = TOP1 + 14.0 + 20.0 * k as f64;
        let _ = writeln!(
            out,
            r#"<rect x="{}" y="{}" width="14" height="14" fill="{}"/><text x="{}" y="{}">{} ({} turns)</text>"#,
            LEFT + 14.0,
            y - 11.0,
            esc(s.color),
            LEFT + 34.0,
            y,
            esc(s.name),
            s.hist.len()
        );
    }
    out.push_str("</svg>\n");
    out
}

fn frame(out: &mut String, top: f64, bottom: f64) {
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{}" height="{}" fill="none" stroke="#444"/>"##,
        RIGHT - LEFT,
        bottom - top
    );
}

fn grid_y(out: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{RIGHT}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
        LEFT - 6.0,
        y + 4.0,
        esc(label)
    );
}

fn grid_x(out: &mut String, x: f64, top: f64, bottom: f64, label: &str) {
    let _ = writeln!(
        out,
        r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{bottom}" stroke="#e4e4e4"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
        bottom + 18.0,
        esc(label)
    );
}

fn axis_titles(out: &mut String, bottom: f64, x_title: &str, y_title: &str) {
    let mid_y = bottom - 120.0;
    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="24" y="{mid_y}" text-anchor="middle" transform="rotate(-90 24 {mid_y})">{}</text>"#,
        (LEFT + RIGHT) / 2.0,
        bottom + 38.0,
        esc(x_title),
        esc(y_title)
    );
}

/// The next of 1, 2, 5 × 10ⁿ at or above `x`.
fn nice_ceiling(x: f64) -> f64 {
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|v| *v >= x)
        .unwrap_or(10.0 * p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::stats::histogram;

    #[test]
    fn draws_both_panels_with_axes_and_a_legend() {
        let mut a = histogram();
        let mut b = histogram();
        for i in 1..5000u64 {
            a.saturating_record(5_000 + i * 3);
            b.saturating_record(1_000 + i);
        }
        let svg = latency_svg(
            "a <test>",
            &[
                Series {
                    name: "engine",
                    color: "#1f77b4",
                    hist: &a,
                },
                Series {
                    name: "direct",
                    color: "#ff7f0e",
                    hist: &b,
                },
            ],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;test&gt;"));
        assert!(svg.contains("<polyline") && svg.contains("share of turns"));
        assert!(svg.contains("99.9 %") && svg.contains("engine (4999 turns)"));
        assert_eq!(svg.matches("<svg").count(), 1);
    }

    #[test]
    fn labels() {
        assert_eq!(nines_label(0), "0 %");
        assert_eq!(nines_label(1), "90 %");
        assert_eq!(nines_label(2), "99 %");
        assert_eq!(nines_label(4), "99.99 %");
        assert_eq!(decade_label(0), "1 µs");
        assert_eq!(decade_label(3), "1 ms");
        assert_eq!(decade_label(-1), "100 ns");
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(1.5), 2.0);
        let empty = histogram();
        assert!(
            latency_svg(
                "t",
                &[Series {
                    name: "e",
                    color: "red",
                    hist: &empty
                }]
            )
            .contains("no turns")
        );
    }
}
