//! `docs/benchmarks.png`: throughput against concurrency, one panel per
//! store. Drawn with `plotters` into a bitmap; text through `ab_glyph` with
//! a TrueType font read at run time (no system font libraries linked).

use std::path::Path;

use anyhow::Context as _;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::results::{Results, Scenario};

/// The series of each panel, and their colors (the peers have a Redis
/// store only, so they appear in the Redis panel).
const SERIES: [(Scenario, RGBColor); 10] = [
    (Scenario::Bare, RGBColor(120, 120, 120)),
    (Scenario::RawWrite, RGBColor(200, 40, 40)),
    (Scenario::GuardFresh, RGBColor(30, 90, 200)),
    (Scenario::RawRead, RGBColor(240, 150, 30)),
    (Scenario::GuardReplay, RGBColor(30, 160, 80)),
    (Scenario::GuardCachedReplay, RGBColor(110, 200, 60)),
    (Scenario::PeerFresh, RGBColor(150, 60, 180)),
    (Scenario::PeerReplay, RGBColor(230, 110, 190)),
    (Scenario::Peer2Fresh, RGBColor(20, 150, 160)),
    (Scenario::Peer2Replay, RGBColor(120, 200, 220)),
];

/// Legend entries per row.
const LEGEND_COLUMNS: usize = 5;

/// One line of a panel: what, its color, and (level index, per second).
type Series = (Scenario, RGBColor, Vec<(usize, f64)>);

/// Draws the plot of `results` into `path`.
pub(crate) fn draw(results: &Results, path: &Path, font: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(font).with_context(|| {
        format!(
            "the plot's font {} (install Debian's fonts-dejavu-core, or pass --font)",
            font.display()
        )
    })?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", font.display()))?;
    let stores = ["postgres", "sqlite", "redis", "tiered"];
    let levels = &results.settings.concurrency;
    let root = BitMapBackend::new(path, (1300, 940)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = if results.settings.smoke {
        "Throughput against concurrency (smoke run: meaningless)"
    } else {
        "Throughput against concurrency, one run (requests or claim+complete per second)"
    };
    let root = root.titled(title, ("sans-serif", 24))?;
    let (area, legend) = root.split_vertically(root.dim_in_pixel().1 - 56);
    draw_legend(&legend)?;
    let panels = area.split_evenly((2, 2));
    for (panel, store) in panels.iter().zip(stores) {
        let series: Vec<Series> = SERIES
            .iter()
            .filter_map(|&(scenario, color)| {
                let row_store = if scenario == Scenario::Bare {
                    "-"
                } else {
                    store
                };
                let points: Vec<(usize, f64)> = levels
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &c)| {
                        results
                            .rows
                            .iter()
                            .find(|r| {
                                r.store == row_store && r.scenario == scenario && r.concurrency == c
                            })
                            .map(|r| (i, r.summary.throughput))
                    })
                    .collect();
                (!points.is_empty()).then_some((scenario, color, points))
            })
            .collect();
        let top = series
            .iter()
            .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
            .fold(1.0_f64, f64::max)
            * 2.0;
        let bottom = series
            .iter()
            .flat_map(|(_, _, points)| points.iter().map(|p| p.1))
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min)
            .min(top / 4.0)
            / 2.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(store, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(
                0usize..levels.len().saturating_sub(1).max(1),
                (bottom.max(1.0)..top).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_labels(levels.len())
            .x_label_formatter(&|i| levels.get(*i).map(ToString::to_string).unwrap_or_default())
            .x_desc("concurrent connections")
            .y_desc("per second (log scale)")
            .y_labels(8)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .label_style(("sans-serif", 14))
            .draw()?;
        for (_, color, points) in series {
            let style = ShapeStyle::from(&color).stroke_width(3);
            chart.draw_series(LineSeries::new(points.clone(), style))?;
            chart.draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )?;
        }
    }
    root.present()?;
    Ok(())
}

/// One legend for every panel, in a strip under them.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let width = i32::try_from(area.dim_in_pixel().0).unwrap_or(1300);
    let step = width / i32::try_from(LEGEND_COLUMNS).unwrap_or(5);
    for (i, (scenario, color)) in SERIES.iter().enumerate() {
        let column = i32::try_from(i % LEGEND_COLUMNS).unwrap_or(0);
        let line = i32::try_from(i / LEGEND_COLUMNS).unwrap_or(0);
        let (x, y) = (10 + step * column, 14 + 24 * line);
        area.draw(&PathElement::new(
            vec![(x, y), (x + 22, y)],
            ShapeStyle::from(color).stroke_width(4),
        ))?;
        area.draw(&Text::new(
            scenario.label(),
            (x + 28, y - 8),
            ("sans-serif", 14).into_font(),
        ))?;
    }
    Ok(())
}
