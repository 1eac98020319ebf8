//! A dependency-free SVG chart of memory over time: step lines per series,
//! axes with round ticks, a legend, and an optional budget line. Long
//! series are reduced per pixel column to their first, minimum, maximum and
//! last points, so no peak is lost.

use std::fmt::Write;

pub(crate) struct Series {
    pub(crate) label: String,
    /// (seconds, bytes); each value holds until the next point.
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) dashed: bool,
}

pub(crate) struct Chart {
    pub(crate) title: String,
    pub(crate) series: Vec<Series>,
}

const W: f64 = 900.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 220.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const PALETTE: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step near `span / 5`.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 5.0).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn fmt_bytes(b: f64) -> String {
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else {
        format!("{:.0} MB", b / 1e6)
    }
}

fn fmt_time(s: f64, span: f64) -> String {
    if span >= 2.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.0} ms", s * 1e3)
    }
}

/// Keeps, per pixel column, the first, lowest, highest and last points.
fn reduce(points: &[(f64, f64)], x: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
    if points.len() <= 4000 {
        return points.to_vec();
    }
    let mut out: Vec<(f64, f64)> = Vec::new();
    let mut i = 0;
    while i < points.len() {
        let col = x(points[i].0).floor();
        let mut j = i;
        while j + 1 < points.len() && x(points[j + 1].0).floor() == col {
            j += 1;
        }
        let group = &points[i..=j];
        let lo = group
            .iter()
            .copied()
            .fold(group[0], |a, p| if p.1 < a.1 { p } else { a });
        let hi = group
            .iter()
            .copied()
            .fold(group[0], |a, p| if p.1 > a.1 { p } else { a });
        let mut keep = vec![group[0], lo, hi, group[group.len() - 1]];
        keep.sort_by(|a, b| a.0.total_cmp(&b.0));
        keep.dedup();
        out.extend(keep);
        i = j + 1;
    }
    out
}

/// An SVG document of the chart size on white, with `title` centred at `x`.
fn svg_start(title: &str, x: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{x}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        escape(title)
    );
    s
}

pub(crate) fn render_svg(chart: &Chart) -> String {
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let all: Vec<(f64, f64)> = chart
        .series
        .iter()
        .flat_map(|s| s.points.iter().filter(finite).copied())
        .collect();
    let t_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.05;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |t: f64| LEFT + t / t_max * pw;
    let y = |v: f64| TOP + ph - v / y_max * ph;
    let mut s = svg_start(&chart.title, LEFT + pw / 2.0);
    let step = tick_step(y_max);
    let mut v = 0.0;
    while v <= y_max {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y(v) + 4.0,
            fmt_bytes(v),
            y = y(v)
        );
        v += step;
    }
    let step = tick_step(t_max);
    let mut t = 0.0;
    while t <= t_max * 1.0001 {
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            x(t),
            TOP + ph + 18.0,
            fmt_time(t, t_max)
        );
        t += step;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for (i, series) in chart.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = series.points.iter().filter(finite).copied().collect();
        let pts = reduce(&pts, x);
        if !pts.is_empty() {
            let mut d = format!("M{:.1},{:.1}", x(pts[0].0), y(pts[0].1));
            for w in pts.windows(2) {
                let _ = write!(d, " H{:.1} V{:.1}", x(w[1].0), y(w[1].1));
            }
            let _ = write!(d, " H{:.1}", x(t_max));
            let dash = if series.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            };
            let _ = writeln!(
                s,
                r#"<path d="{d}" fill="none" stroke="{color}" stroke-width="1.3"{dash}/>"#
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{}/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 15.0,
            W - RIGHT + 40.0,
            if series.dashed {
                r#" stroke-dasharray="5,3""#
            } else {
                ""
            },
            W - RIGHT + 46.0,
            ly + 4.0,
            escape(&series.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A grouped bar chart: one group per label, one bar per series in each;
/// a missing value (`None`: the run failed) is drawn as an empty slot with
/// a cross.
pub(crate) struct Bars {
    pub(crate) title: String,
    pub(crate) y_label: String,
    pub(crate) groups: Vec<String>,
    pub(crate) series: Vec<(String, Vec<Option<f64>>)>,
}

pub(crate) fn render_bars(b: &Bars) -> String {
    let vals = || b.series.iter().flat_map(|s| s.1.iter().flatten().copied());
    let y_max = vals()
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.08;
    let y_min = vals().filter(|v| v.is_finite()).fold(0.0, f64::min) * 1.08;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM - 30.0);
    let y = |v: f64| TOP + ph - (v - y_min) / (y_max - y_min) * ph;
    let groups = b.groups.len().max(1) as f64;
    let gw = pw / groups;
    let bw = gw * 0.8 / b.series.len().max(1) as f64;
    let mut s = svg_start(&b.title, LEFT + pw / 2.0);
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(&b.y_label)
    );
    let step = tick_step(y_max - y_min);
    let mut v = (y_min / step).ceil() * step;
    while v <= y_max {
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{yv:.1}" y2="{yv:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y(v) + 4.0,
            fmt_value(v, step),
            yv = y(v)
        );
        v += step;
    }
    for (g, label) in b.groups.iter().enumerate() {
        let gx = LEFT + gw * g as f64 + gw * 0.1;
        for (i, (_, values)) in b.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let x = gx + bw * i as f64;
            match values.get(g).copied().flatten().filter(|v| v.is_finite()) {
                Some(v) => {
                    let (top, bottom) = (y(v.max(0.0)), y(v.min(0.0)));
                    let _ = writeln!(
                        s,
                        r#"<rect x="{x:.1}" y="{top:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}: {v:.4}</title></rect>"#,
                        (bw - 1.0).max(0.5),
                        (bottom - top).max(0.5),
                        escape(&b.series[i].0)
                    );
                }
                None => {
                    let y0 = y(0.0);
                    let _ = writeln!(
                        s,
                        r#"<path d="M{x:.1},{:.1} l{:.1},-8 M{x:.1},{:.1} l{:.1},8" stroke="{color}"/>"#,
                        y0,
                        bw - 1.0,
                        y0 - 8.0,
                        bw - 1.0
                    );
                }
            }
        }
        let lx = LEFT + gw * (g as f64 + 0.5);
        let ly = TOP + ph + 14.0;
        let _ = writeln!(
            s,
            r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="end" transform="rotate(-30 {lx:.1} {ly:.1})">{}</text>"#,
            escape(label)
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for (i, (label, _)) in b.series.iter().enumerate() {
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{}" y="{}" width="18" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            W - RIGHT + 15.0,
            ly - 5.0,
            PALETTE[i % PALETTE.len()],
            W - RIGHT + 40.0,
            ly + 4.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn fmt_value(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else {
        let digits = (-step.log10()).ceil().max(0.0) as usize;
        format!("{v:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_escaped_and_keeps_the_peak() {
        let mut points: Vec<(f64, f64)> = (0..20_000).map(|i| (i as f64 * 1e-4, 1e8)).collect();
        points[12_345].1 = 9e8;
        let chart = Chart {
            title: "a <b> & c".into(),
            series: vec![Series {
                label: "job<1>".into(),
                points: points.clone(),
                dashed: false,
            }],
        };
        let svg = render_svg(&chart);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("a &lt;b&gt; &amp; c") && svg.contains("job&lt;1&gt;"));
        let reduced = reduce(&points, |t| t * 100.0);
        assert!(reduced.len() < 2000);
        assert!(reduced.iter().any(|p| p.1 == 9e8));
    }

    #[test]
    fn bars_draw_every_value_and_mark_missing_ones() {
        let b = Bars {
            title: "MSR <single>".into(),
            y_label: "MSR".into(),
            groups: vec!["vgg16".into(), "resnet50".into()],
            series: vec![
                ("tensile".into(), vec![Some(0.4), Some(0.3)]),
                ("vdnn".into(), vec![Some(-0.1), None]),
            ],
        };
        let svg = render_bars(&b);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<title>").count(), 3, "{svg}");
        assert!(svg.contains("tensile: 0.4000") && svg.contains("vdnn: -0.1000"));
        assert!(svg.contains("MSR &lt;single&gt;"));
        // The missing value is a cross, not a bar.
        assert_eq!(svg.matches(" l").count(), 2, "{svg}");
    }

    #[test]
    fn empty_and_degenerate_series_render() {
        let chart = Chart {
            title: String::new(),
            series: vec![
                Series {
                    label: "empty".into(),
                    points: vec![],
                    dashed: true,
                },
                Series {
                    label: "nan".into(),
                    points: vec![(f64::NAN, 1.0), (0.0, 0.0)],
                    dashed: false,
                },
            ],
        };
        assert!(render_svg(&chart).ends_with("</svg>\n"));
    }
}
