//! SVG charts with plotters (its SVG backend: no fonts, no bitmaps): memory
//! over time as step lines per series, and grouped bars. Long series are
//! reduced per pixel column to their first, lowest, highest and last
//! points, so no peak is lost.
//!
//! The legend is a column right of the plot, as wide as its longest label
//! needs: the job names of `sim --plot` used to run off the right edge.
//! SVG has no text metrics, so widths are estimated with a per-character
//! width that errs on the wide side.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// A grouped bar chart: one group per label, one bar per series in each;
/// a missing value (`None`: the run failed) is drawn as a cross.
pub(crate) struct Bars {
    pub(crate) title: String,
    pub(crate) y_label: String,
    pub(crate) groups: Vec<String>,
    pub(crate) series: Vec<(String, Vec<Option<f64>>)>,
}

/// Width of the plot, legend aside, and height of the memory chart.
const PLOT_W: u32 = 720;
const H: u32 = 500;
/// plotters writes `font-size` as the size given / 1.24: these are 12 px
/// and 15 px in the SVG.
const FONT: f64 = 15.0;
const TITLE_FONT: f64 = 18.6;
/// A generous width of one character at 12 px (sans-serif fonts average
/// 6-7 px; DejaVu Sans, common on Linux, is wide).
const CHAR_W: u32 = 8;
/// Legend: left padding, swatch width, gap before the text, right padding.
const LEGEND_PAD: u32 = 10;
const SWATCH_W: u32 = 25;
const SWATCH_GAP: u32 = 7;
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];
const GRID: RGBColor = RGBColor(0xdd, 0xdd, 0xdd);

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

fn font() -> TextStyle<'static> {
    TextStyle::from(("sans-serif", FONT).into_font())
}

fn text_w(s: &str) -> u32 {
    s.chars().count() as u32 * CHAR_W
}

/// How one legend entry is drawn.
enum Swatch {
    Line { dashed: bool },
    Box,
}

/// The legend column's width for these labels.
fn legend_width<'a>(labels: impl Iterator<Item = &'a str>) -> u32 {
    let longest = labels.map(text_w).max().unwrap_or(0);
    LEGEND_PAD + SWATCH_W + SWATCH_GAP + longest + LEGEND_PAD
}

fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    entries: &[(&str, RGBColor, Swatch)],
) -> Result<()> {
    let left = LEGEND_PAD as i32;
    let right = left + SWATCH_W as i32;
    for (i, (label, c, swatch)) in entries.iter().enumerate() {
        let y = 50 + 18 * i as i32;
        match swatch {
            Swatch::Line { dashed: false } => {
                area.draw(&PathElement::new(
                    [(left, y), (right, y)],
                    c.stroke_width(2),
                ))?;
            }
            Swatch::Line { dashed: true } => {
                area.draw(&DashedPathElement::new(
                    [(left, y), (right, y)],
                    5,
                    3,
                    c.stroke_width(2),
                ))?;
            }
            Swatch::Box => {
                area.draw(&Rectangle::new([(left, y - 5), (right, y + 5)], c.filled()))?;
            }
        }
        let style = font().pos(Pos::new(HPos::Left, VPos::Center));
        area.draw(&Text::new(
            label.to_string(),
            (right + SWATCH_GAP as i32, y),
            style,
        ))?;
    }
    Ok(())
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

/// The corners of a step line through `points`, held to `t_end`.
fn steps(points: &[(f64, f64)], t_end: f64) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2 + 1);
    for (i, &(t, v)) in points.iter().enumerate() {
        if i > 0 {
            out.push((t, points[i - 1].1));
        }
        out.push((t, v));
    }
    if let Some(&(t, v)) = points.last()
        && t < t_end
    {
        out.push((t_end, v));
    }
    out
}

/// Memory over time, one step line per series.
pub(crate) fn render_svg(chart: &Chart) -> Result<String> {
    let finite = |p: &&(f64, f64)| p.0.is_finite() && p.1.is_finite();
    let all = || {
        chart
            .series
            .iter()
            .flat_map(|s| s.points.iter().filter(finite))
    };
    let t_max = all().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
    let y_max = all().map(|p| p.1).fold(0.0, f64::max).max(1.0) * 1.05;
    let legend_w = legend_width(chart.series.iter().map(|s| s.label.as_str()));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (PLOT_W + legend_w, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot, legend) = root.split_horizontally(PLOT_W);
        let mut c = ChartBuilder::on(&plot)
            .caption(&chart.title, ("sans-serif", TITLE_FONT))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max)?;
        let (x_step, y_step) = (tick_step(t_max), tick_step(y_max));
        c.configure_mesh()
            .disable_x_mesh()
            .bold_line_style(GRID)
            .max_light_lines(0)
            .x_labels((t_max / x_step) as usize + 1)
            .y_labels((y_max / y_step) as usize + 1)
            .x_label_formatter(&|t| fmt_time(*t, t_max))
            .y_label_formatter(&|b| fmt_bytes(*b))
            .label_style(font())
            .draw()?;
        let (x0, x1) = (
            c.backend_coord(&(0.0, 0.0)).0,
            c.backend_coord(&(t_max, 0.0)).0,
        );
        let px_per_s = f64::from(x1 - x0) / t_max;
        for (i, s) in chart.series.iter().enumerate() {
            let points: Vec<(f64, f64)> = s.points.iter().filter(finite).copied().collect();
            let points = steps(&reduce(&points, |t| t * px_per_s), t_max);
            let style = color(i).stroke_width(1);
            if s.dashed {
                c.draw_series(DashedLineSeries::new(points, 5, 3, style))?;
            } else {
                c.draw_series(LineSeries::new(points, style))?;
            }
        }
        let entries: Vec<(&str, RGBColor, Swatch)> = chart
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.label.as_str(),
                    color(i),
                    Swatch::Line { dashed: s.dashed },
                )
            })
            .collect();
        draw_legend(&legend, &entries)?;
        root.present()?;
    }
    Ok(svg)
}

/// Grouped bars, group labels below the axis, reading upwards.
pub(crate) fn render_bars(b: &Bars) -> Result<String> {
    render_bars_wide(b, 0)
}

/// [`render_bars`], the plot at least `bar_w` pixels a bar wide (many
/// groups: the sweep's cases).
pub(crate) fn render_bars_wide(b: &Bars, bar_w: u32) -> Result<String> {
    let bars = (b.groups.len() * b.series.len().max(1)) as u32;
    let plot_w = PLOT_W.max(bars * bar_w + 100);
    let values = || {
        b.series
            .iter()
            .flat_map(|s| s.1.iter().flatten().copied())
            .filter(|v| v.is_finite())
    };
    let y_max = values().fold(0.0, f64::max).max(1e-9) * 1.08;
    let y_min = values().fold(0.0, f64::min) * 1.08;
    let groups = b.groups.len().max(1);
    let label_h = b.groups.iter().map(|g| text_w(g)).max().unwrap_or(0) + 12;
    let legend_w = legend_width(b.series.iter().map(|s| s.0.as_str()));
    let mut svg = String::new();
    {
        let size = (plot_w + legend_w, H - 30 + label_h);
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE)?;
        let (plot, legend) = root.split_horizontally(plot_w);
        let mut c = ChartBuilder::on(&plot)
            .caption(&b.title, ("sans-serif", TITLE_FONT))
            .margin(12)
            .x_label_area_size(label_h)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..groups as f64, y_min..y_max)?;
        c.configure_mesh()
            .disable_x_mesh()
            .bold_line_style(GRID)
            .max_light_lines(0)
            .x_labels(0)
            .y_desc(b.y_label.as_str())
            .label_style(font())
            .axis_desc_style(font())
            .draw()?;
        let per_bar = 0.8 / b.series.len().max(1) as f64;
        let cross = (y_max - y_min) * 0.02;
        for (i, (_, vals)) in b.series.iter().enumerate() {
            let c_i = color(i);
            for g in 0..b.groups.len() {
                let x0 = g as f64 + 0.1 + per_bar * i as f64;
                let x1 = x0 + per_bar * 0.9;
                match vals.get(g).copied().flatten().filter(|v| v.is_finite()) {
                    Some(v) => {
                        c.draw_series([Rectangle::new([(x0, 0.0), (x1, v)], c_i.filled())])?;
                    }
                    None => {
                        let style = c_i.stroke_width(1);
                        c.draw_series([
                            PathElement::new([(x0, -cross), (x1, cross)], style),
                            PathElement::new([(x0, cross), (x1, -cross)], style),
                        ])?;
                    }
                }
            }
        }
        if y_min < 0.0 {
            c.draw_series([PathElement::new(
                [(0.0, 0.0), (groups as f64, 0.0)],
                BLACK.stroke_width(1),
            )])?;
        }
        let style = font()
            .transform(FontTransform::Rotate270)
            .pos(Pos::new(HPos::Right, VPos::Center));
        for (g, label) in b.groups.iter().enumerate() {
            let (x, y) = c.backend_coord(&(g as f64 + 0.5, y_min));
            plot.draw(&Text::new(label.clone(), (x, y + 6), style.clone()))?;
        }
        let entries: Vec<(&str, RGBColor, Swatch)> = b
            .series
            .iter()
            .enumerate()
            .map(|(i, s)| (s.0.as_str(), color(i), Swatch::Box))
            .collect();
        draw_legend(&legend, &entries)?;
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SVG's width, and every left-anchored text's x and content.
    fn texts(svg: &str) -> (u32, Vec<(f64, String)>) {
        let attr = |tag: &str, name: &str| -> Option<String> {
            let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
            Some(tag[at..].split('"').next()?.to_string())
        };
        let width = attr(svg, "width").unwrap().parse().unwrap();
        let mut out = Vec::new();
        for part in svg.split("<text").skip(1) {
            let (tag, rest) = part.split_once('>').unwrap();
            if attr(tag, "text-anchor").as_deref() == Some("start") && !tag.contains("rotate") {
                let x = attr(tag, "x").unwrap().parse().unwrap();
                out.push((x, rest.split('<').next().unwrap().trim().to_string()));
            }
        }
        (width, out)
    }

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
        let svg = render_svg(&chart).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt; &amp; c") && svg.contains("job&lt;1&gt;"));
        let reduced = reduce(&points, |t| t * 100.0);
        assert!(reduced.len() < 2000);
        assert!(reduced.iter().any(|p| p.1 == 9e8));
    }

    #[test]
    fn long_legend_labels_stay_inside_the_drawing() {
        let series = |label: &str, dashed| Series {
            label: label.into(),
            points: vec![(0.0, 1e8), (0.5, 3e8), (1.0, 2e8)],
            dashed,
        };
        let chart = Chart {
            title: "Memory over time".into(),
            series: vec![
                series("total, vanilla", true),
                series("inception_v3_b2_r299_adam checkpoint-blocks", false),
            ],
        };
        let svg = render_svg(&chart).unwrap();
        let (width, texts) = texts(&svg);
        let legend: Vec<_> = texts.iter().filter(|(x, _)| *x > PLOT_W as f64).collect();
        assert_eq!(legend.len(), 2, "{texts:?}");
        for (x, text) in &legend {
            let end = x + text_w(text) as f64;
            assert!(end <= width as f64, "{text:?} ends at {end} > {width}");
        }
        assert!(svg.contains("stroke-dasharray") || svg.matches("<polyline").count() > 3);
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
        let svg = render_bars(&b).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("MSR &lt;single&gt;"));
        // Each series: its bars and its legend swatch; the missing value
        // is a cross (two lines), not a bar.
        let fill = |c: RGBColor| format!("fill=\"#{:02X}{:02X}{:02X}\"", c.0, c.1, c.2);
        assert_eq!(svg.matches(&fill(color(0))).count(), 3, "{svg}");
        assert_eq!(svg.matches(&fill(color(1))).count(), 2, "{svg}");
        for label in ["vgg16", "resnet50", "tensile", "vdnn"] {
            assert!(svg.contains(&format!(">\n{label}\n<")), "{label}: {svg}");
        }
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
        assert!(render_svg(&chart).unwrap().contains("</svg>"));
        let bars = Bars {
            title: String::new(),
            y_label: String::new(),
            groups: vec![],
            series: vec![],
        };
        assert!(render_bars(&bars).unwrap().contains("</svg>"));
    }
}
