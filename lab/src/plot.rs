//! The plot of both runs over time, as a hand-written SVG: five panels
//! sharing the time axis, the fault window shaded.

use std::fmt::Write as _;

use crate::schedule::FaultSchedule;
use crate::tally::{Rate, SMOOTHING, Series};

const WIDTH: f64 = 1000.0;
const PANEL_HEIGHT: f64 = 190.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 230.0;
const TOP: f64 = 40.0;
const GAP: f64 = 56.0;
const NAIVE: &str = "#d62728";
const GUARDED: &str = "#1f77b4";
const DEBITS: &str = "#7f7f7f";

/// How a line is drawn.
#[derive(Debug, Clone, Copy)]
enum Stroke {
    Solid,
    Dashed,
    Dotted,
}

impl Stroke {
    fn attributes(self) -> &'static str {
        match self {
            Self::Solid => r#"stroke-width="2""#,
            Self::Dashed => r#"stroke-width="1.5" stroke-dasharray="7 4""#,
            Self::Dotted => r#"stroke-width="2" stroke-dasharray="2 3""#,
        }
    }
}

/// One line of a panel.
struct Line<'a> {
    label: String,
    colour: &'a str,
    stroke: Stroke,
    values: Vec<Rate>,
}

impl<'a> Line<'a> {
    fn counts(label: &str, colour: &'a str, stroke: Stroke, values: &[f64]) -> Self {
        Self {
            label: label.to_owned(),
            colour,
            stroke,
            values: values.iter().map(|v| Some(*v)).collect(),
        }
    }

    fn ratios(label: &str, colour: &'a str, stroke: Stroke, values: &[Rate]) -> Self {
        Self {
            label: label.to_owned(),
            colour,
            stroke,
            values: values.to_vec(),
        }
    }

    fn rates(label: &str, colour: &'a str, stroke: Stroke, values: &[Rate]) -> Self {
        Self {
            label: label.to_owned(),
            colour,
            stroke,
            values: values.iter().map(|v| v.map(|v| v * 100.0)).collect(),
        }
    }
}

/// The SVG of both runs' series, `seconds` long, with `schedule`'s window.
pub fn svg(naive: &Series, guarded: &Series, schedule: &FaultSchedule, seconds: usize) -> String {
    let panels: Vec<(String, Option<f64>, Vec<Line<'_>>)> = vec![
        (
            "Requests reaching the API per second (dashed: of which retries)".into(),
            None,
            vec![
                Line::counts("naive: requests", NAIVE, Stroke::Solid, &naive.requests),
                Line::counts("naive: retries", NAIVE, Stroke::Dashed, &naive.retries),
                Line::counts(
                    "guarded: requests",
                    GUARDED,
                    Stroke::Solid,
                    &guarded.requests,
                ),
                Line::counts(
                    "guarded: retries",
                    GUARDED,
                    Stroke::Dashed,
                    &guarded.retries,
                ),
            ],
        ),
        (
            "Debit executions per second (dashed: double charges made)".into(),
            None,
            vec![
                Line::counts("debits started", DEBITS, Stroke::Dotted, &naive.debits),
                Line::counts("naive: executions", NAIVE, Stroke::Solid, &naive.executions),
                Line::counts(
                    "naive: extra executions",
                    NAIVE,
                    Stroke::Dashed,
                    &naive.extra_executions,
                ),
                Line::counts(
                    "guarded: executions",
                    GUARDED,
                    Stroke::Solid,
                    &guarded.executions,
                ),
                Line::counts(
                    "guarded: extra executions",
                    GUARDED,
                    Stroke::Dashed,
                    &guarded.extra_executions,
                ),
            ],
        ),
        (
            format!("Amplification: requests per operation started (trailing {SMOOTHING} s)"),
            None,
            vec![
                Line::ratios(
                    "naive: writes",
                    NAIVE,
                    Stroke::Solid,
                    &naive.write_amplification,
                ),
                Line::ratios(
                    "naive: reads",
                    NAIVE,
                    Stroke::Dotted,
                    &naive.read_amplification,
                ),
                Line::ratios(
                    "naive: blended",
                    NAIVE,
                    Stroke::Dashed,
                    &naive.blended_amplification,
                ),
                Line::ratios(
                    "guarded: writes",
                    GUARDED,
                    Stroke::Solid,
                    &guarded.write_amplification,
                ),
                Line::ratios(
                    "guarded: reads",
                    GUARDED,
                    Stroke::Dotted,
                    &guarded.read_amplification,
                ),
                Line::ratios(
                    "guarded: blended",
                    GUARDED,
                    Stroke::Dashed,
                    &guarded.blended_amplification,
                ),
            ],
        ),
        (
            format!("Retry rate, % of requests (trailing {SMOOTHING} s)"),
            Some(100.0),
            vec![
                Line::rates(
                    "naive: writes",
                    NAIVE,
                    Stroke::Solid,
                    &naive.write_retry_rate,
                ),
                Line::rates(
                    "naive: reads",
                    NAIVE,
                    Stroke::Dotted,
                    &naive.read_retry_rate,
                ),
                Line::rates(
                    "naive: blended",
                    NAIVE,
                    Stroke::Dashed,
                    &naive.blended_retry_rate,
                ),
                Line::rates(
                    "guarded: writes",
                    GUARDED,
                    Stroke::Solid,
                    &guarded.write_retry_rate,
                ),
                Line::rates(
                    "guarded: reads",
                    GUARDED,
                    Stroke::Dotted,
                    &guarded.read_retry_rate,
                ),
                Line::rates(
                    "guarded: blended",
                    GUARDED,
                    Stroke::Dashed,
                    &guarded.blended_retry_rate,
                ),
            ],
        ),
        (
            format!("Retry success rate, % of retries (trailing {SMOOTHING} s)"),
            Some(100.0),
            vec![
                Line::rates(
                    "naive: writes",
                    NAIVE,
                    Stroke::Solid,
                    &naive.write_retry_success,
                ),
                Line::rates(
                    "naive: reads",
                    NAIVE,
                    Stroke::Dotted,
                    &naive.read_retry_success,
                ),
                Line::rates(
                    "naive: blended",
                    NAIVE,
                    Stroke::Dashed,
                    &naive.blended_retry_success,
                ),
                Line::rates(
                    "guarded: writes",
                    GUARDED,
                    Stroke::Solid,
                    &guarded.write_retry_success,
                ),
                Line::rates(
                    "guarded: reads",
                    GUARDED,
                    Stroke::Dotted,
                    &guarded.read_retry_success,
                ),
                Line::rates(
                    "guarded: blended",
                    GUARDED,
                    Stroke::Dashed,
                    &guarded.blended_retry_success,
                ),
            ],
        ),
    ];
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + GAP);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="20" font-size="15" font-weight="bold">The incident lab: naive and guarded clients through the same faults (shaded: the fault window)</text>"#
    );
    for (i, (title, fixed_max, lines)) in panels.iter().enumerate() {
        let top = TOP + i as f64 * (PANEL_HEIGHT + GAP) + 20.0;
        panel(&mut out, top, title, *fixed_max, lines, schedule, seconds);
    }
    out.push_str("</svg>\n");
    out
}

/// A round upper bound for an axis: 1, 2 or 5 times a power of ten.
fn nice_max(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|bound| *bound >= max)
        .unwrap_or(10.0 * power)
}

fn panel(
    out: &mut String,
    top: f64,
    title: &str,
    fixed_max: Option<f64>,
    lines: &[Line<'_>],
    schedule: &FaultSchedule,
    seconds: usize,
) {
    let plot_width = WIDTH - LEFT - RIGHT;
    let span = seconds.max(1) as f64;
    let max = fixed_max.unwrap_or_else(|| {
        nice_max(
            lines
                .iter()
                .flat_map(|l| l.values.iter().flatten())
                .fold(0.0, |a: f64, b| a.max(*b)),
        )
    });
    let x = |second: f64| LEFT + plot_width * second / span;
    let y = |value: f64| top + PANEL_HEIGHT * (1.0 - value / max);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="{}" font-weight="bold">{title}</text>"#,
        top - 8.0
    );
    let (from, to) = (
        schedule.start.as_secs_f64().min(span),
        (schedule.start + schedule.window).as_secs_f64().min(span),
    );
    let _ = writeln!(
        out,
        r##"<rect x="{:.1}" y="{top}" width="{:.1}" height="{PANEL_HEIGHT}" fill="#fbe3c4"/>"##,
        x(from),
        x(to) - x(from)
    );
    for step in 0..=4 {
        let value = max * f64::from(step) / 4.0;
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#dddddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_width,
            y(value),
            y(value),
            LEFT - 6.0,
            y(value) + 4.0,
            trim(value)
        );
    }
    let mut second = 0;
    while second <= seconds {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{second} s</text>"#,
            x(second as f64),
            top + PANEL_HEIGHT + 16.0
        );
        second += 10;
    }
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{top}" width="{plot_width}" height="{PANEL_HEIGHT}" fill="none" stroke="#999999"/>"##
    );
    for (n, line) in lines.iter().enumerate() {
        // A gap in the data (no requests that second) breaks the line.
        let mut runs: Vec<Vec<String>> = vec![Vec::new()];
        for (s, value) in line.values.iter().enumerate() {
            match value {
                Some(v) => runs
                    .last_mut()
                    .map(|run| run.push(format!("{:.1},{:.1}", x(s as f64 + 0.5), y(*v)))),
                None => {
                    runs.push(Vec::new());
                    None
                }
            };
        }
        for run in runs.iter().filter(|run| !run.is_empty()) {
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{}" {} points="{}"/>"#,
                line.colour,
                line.stroke.attributes(),
                run.join(" ")
            );
        }
        let legend_y = top + 12.0 + n as f64 * 18.0;
        let legend_x = LEFT + plot_width + 12.0;
        let _ = writeln!(
            out,
            r#"<line x1="{legend_x}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{}" {}/><text x="{}" y="{}">{}</text>"#,
            legend_x + 28.0,
            line.colour,
            line.stroke.attributes(),
            legend_x + 34.0,
            legend_y + 4.0,
            line.label
        );
    }
}

/// A tick label: whole numbers without decimals.
fn trim(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_end_on_round_numbers() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(43.0), 50.0);
        assert_eq!(nice_max(120.0), 200.0);
    }

    #[test]
    fn the_plot_is_one_svg_with_a_line_per_series_and_gaps_where_nothing_was_counted() {
        let mut naive = Series {
            requests: vec![1.0, 2.0, 3.0],
            retries: vec![0.0, 1.0, 0.0],
            ..Series::default()
        };
        naive.write_retry_rate = vec![Some(0.0), None, Some(0.5)];
        let svg = svg(&naive, &Series::default(), &FaultSchedule::new(1), 3);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Two runs of the write retry rate around its gap.
        assert!(svg.matches("<polyline").count() >= 4);
        assert!(svg.contains("naive: writes") && svg.contains("guarded: blended"));
    }
}
