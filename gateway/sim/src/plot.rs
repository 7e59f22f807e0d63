//! A self-contained SVG chart comparing policies, drawn with `plotters`: the queueing-delay CDF
//! of each (left) and what each cost (right, compute and egress stacked).
//!
//! The SVG uses no scripts, external fonts or stylesheets, so it opens anywhere and can be
//! committed next to a report. plotters is built with its SVG backend only: text goes into the
//! file as `<text>` elements laid out by the viewer, so no font is loaded at build or run time.
//! Every coordinate is a whole pixel, so equal input gives equal bytes.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Canvas width, px.
const WIDTH: u32 = 900;
/// Canvas height, px.
const HEIGHT: u32 = 420;
/// Width of the left (CDF) panel; the cost panel takes the rest.
const CDF_PANEL_WIDTH: u32 = 470;
/// Every text is set in the viewer's sans-serif face.
const FONT: &str = "sans-serif";
/// Font sizes (plotters' units: the SVG gets these ÷ 1.24 px).
const TITLE_SIZE: f64 = 20.0;
const PANEL_TITLE_SIZE: f64 = 17.0;
const LABEL_SIZE: f64 = 14.0;
/// Most points drawn per CDF line; more would only grow the file.
const MAX_CDF_POINTS: usize = 400;
/// The x axis spans at least 1 s to this, so a run without waits still gets a readable axis.
const MIN_DELAY_AXIS_SECS: f64 = 10.0;
/// Room a policy name takes on the cost panel's axis, px per character.
const NAME_CHAR_WIDTH: u32 = 7;
/// Longer policy names are cut on the cost panel's axis.
const MAX_BAR_LABEL_CHARS: usize = 24;
/// A cost bar's thickness as a share of its row.
const BAR_THICKNESS: f64 = 0.7;
/// Most ticks on the cost axis.
const COST_TICKS: usize = 6;
/// The cost axis reaches this much past the dearest bar, leaving room for its value label.
const COST_HEADROOM: f64 = 1.2;
/// Line colors, one per policy, repeating after ten (Tableau 10).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];
/// Bar colors of the two cost parts.
const COMPUTE_COLOR: RGBColor = RGBColor(0x4e, 0x79, 0xa7);
const EGRESS_COLOR: RGBColor = RGBColor(0xf2, 0x8e, 0x2b);
/// Candidate ticks of the delay axis, seconds and label.
const DELAY_TICKS: [(f64, &str); 9] = [
    (1.0, "1s"),
    (10.0, "10s"),
    (60.0, "1m"),
    (600.0, "10m"),
    (3_600.0, "1h"),
    (86_400.0, "1d"),
    (604_800.0, "1w"),
    (2_592_000.0, "30d"),
    (31_536_000.0, "1y"),
];

/// One policy's data for the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct PlotSeries {
    /// Policy name (legend and bar label).
    pub policy: String,
    /// Queueing delays of every job in seconds, ascending ([`super::metrics::sorted_delays`]).
    pub sorted_delays: Vec<f64>,
    /// US$ for GPUs.
    pub compute_usd: f64,
    /// US$ for moving data.
    pub egress_usd: f64,
}

/// Why the chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// plotters refused a drawing operation; it names which.
    #[error("drawing the chart: {0}")]
    Draw(String),
}

type Result<T, E = PlotError> = std::result::Result<T, E>;

/// The SVG backend's drawing area.
type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// An SVG (self-contained, 900×420, no external fonts or scripts) with two panels.
///
/// Left: the queueing-delay CDF of each policy, x on a log scale from 1 s to the largest delay
/// (at least 10 s; delays under 1 s are drawn at 1 s) with ticks at 1s, 10s, 1m, 10m, 1h, 1d…,
/// y from 0 to 1, one line per policy in distinct colors, with a legend. Each line has at most
/// ~400 points, evenly spaced in rank.
/// Right: total US$ per policy as horizontal bars, compute and egress stacked, with value
/// labels; the policies read top to bottom in `series` order.
/// Non-finite or negative inputs are drawn as zero; control characters in names as spaces.
pub fn render_svg(title: &str, series: &[PlotSeries]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(drawing("the background"))?;
        let title_style = (FONT, TITLE_SIZE).into_font().style(FontStyle::Bold);
        let body = root.titled(&printable(title), title_style).map_err(drawing("the title"))?;
        let (left, right) = body.split_horizontally(CDF_PANEL_WIDTH);
        draw_cdf_panel(&left, series)?;
        draw_cost_panel(&right, series)?;
        root.present().map_err(drawing("the document"))?;
    }
    Ok(svg)
}

/// The left panel: axes, ticks, one CDF line per policy and the legend.
fn draw_cdf_panel(area: &Area<'_>, series: &[PlotSeries]) -> Result<()> {
    let delays: Vec<Vec<f64>> = series.iter().map(|one| clean_sorted(&one.sorted_delays)).collect();
    let largest = delays.iter().filter_map(|one| one.last().copied()).fold(0.0, f64::max);
    let axis_max = largest.max(MIN_DELAY_AXIS_SECS);
    let ticks: Vec<f64> =
        DELAY_TICKS.iter().map(|(secs, _)| *secs).filter(|secs| *secs <= axis_max * 1.000_001).collect();

    let mut chart = ChartBuilder::on(area)
        .caption("Queueing delay CDF", (FONT, PANEL_TITLE_SIZE))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((1.0..axis_max).log_scale().with_key_points(ticks), 0.0..1.0)
        .map_err(drawing("the CDF axes"))?;
    chart
        .configure_mesh()
        .x_labels(DELAY_TICKS.len())
        .x_label_formatter(&|secs| delay_label(*secs))
        .y_labels(6)
        .y_label_formatter(&|fraction| format!("{fraction:.2}"))
        .x_desc("queueing delay (log scale)")
        .y_desc("fraction of jobs")
        .label_style((FONT, LABEL_SIZE))
        .bold_line_style(RGBColor(0xe5, 0xe5, 0xe5))
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(drawing("the CDF grid"))?;

    for (index, (one, sorted)) in series.iter().zip(&delays).enumerate() {
        let color = color(index);
        let points = cdf_points(sorted).into_iter().map(|(secs, fraction)| (secs.max(1.0), fraction));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(drawing("a CDF line"))?
            .label(printable(&one.policy))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
    }
    if !series.is_empty() {
        // Bottom right stays empty in a CDF: every line has risen by the time it gets there.
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, LABEL_SIZE))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(0xcc, 0xcc, 0xcc))
            .draw()
            .map_err(drawing("the CDF legend"))?;
    }
    Ok(())
}

/// The right panel: one horizontal bar per policy, compute and egress stacked, its total at
/// its end, and a key of the two parts.
fn draw_cost_panel(area: &Area<'_>, series: &[PlotSeries]) -> Result<()> {
    let costs: Vec<(f64, f64)> =
        series.iter().map(|one| (non_negative(one.compute_usd), non_negative(one.egress_usd))).collect();
    let largest = costs.iter().map(|(compute, egress)| compute + egress).fold(0.0, f64::max);
    // plotters picks the dollar ticks (round numbers, at most `COST_TICKS`) on this axis.
    let (axis_max, _) = nice_axis(largest * COST_HEADROOM);
    let rows = series.len().max(1);
    let names: Vec<String> = series.iter().map(|one| shortened(&printable(&one.policy), MAX_BAR_LABEL_CHARS)).collect();
    let longest_name = names.iter().map(|name| name.chars().count()).max().unwrap_or(0);
    let name_area = (NAME_CHAR_WIDTH * u32::try_from(longest_name).unwrap_or(u32::MAX)).saturating_add(12);

    let mut chart = ChartBuilder::on(area)
        .caption("Cost per policy (US$)", (FONT, PANEL_TITLE_SIZE))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(name_area)
        // Row `index` spans y = rows - index - 1 to rows - index: the first policy is on top.
        .build_cartesian_2d(0.0..axis_max, 0.0..rows as f64)
        .map_err(drawing("the cost axes"))?;
    chart
        .configure_mesh()
        .x_labels(COST_TICKS)
        .x_label_formatter(&|usd| short_usd(*usd))
        // The policy names are drawn below, one per bar, rather than on numeric ticks.
        .y_labels(0)
        .x_desc("US$")
        .label_style((FONT, LABEL_SIZE))
        .bold_line_style(RGBColor(0xe5, 0xe5, 0xe5))
        .light_line_style(TRANSPARENT)
        .disable_y_mesh()
        .draw()
        .map_err(drawing("the cost grid"))?;

    let center_of = |index: usize| rows as f64 - index as f64 - 0.5;
    let half = BAR_THICKNESS / 2.0;
    let bar = |index: usize, from: f64, to: f64, color: RGBColor| {
        Rectangle::new([(from, center_of(index) + half), (to, center_of(index) - half)], color.filled())
    };
    chart
        .draw_series(costs.iter().enumerate().map(|(index, (compute, _))| bar(index, 0.0, *compute, COMPUTE_COLOR)))
        .map_err(drawing("the compute bars"))?;
    chart
        .draw_series(
            costs
                .iter()
                .enumerate()
                .map(|(index, (compute, egress))| bar(index, *compute, compute + egress, EGRESS_COLOR)),
        )
        .map_err(drawing("the egress bars"))?;
    let name_style = TextStyle::from((FONT, LABEL_SIZE).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    let (base_x, base_y) = area.get_base_pixel();
    for (index, name) in names.iter().enumerate() {
        // The chart maps to the backend's pixels; the panel draws relative to its own corner.
        let (x, y) = chart.backend_coord(&(0.0, center_of(index)));
        area.draw(&Text::new(name.as_str(), (x - base_x - 6, y - base_y), name_style.clone()))
            .map_err(drawing("the policy names"))?;
    }
    let value_style = TextStyle::from((FONT, LABEL_SIZE).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    chart
        .draw_series(costs.iter().enumerate().map(|(index, (compute, egress))| {
            let total = compute + egress;
            Text::new(short_usd(total), (total + axis_max * 0.01, center_of(index)), value_style.clone())
        }))
        .map_err(drawing("the cost labels"))?;
    // The key of the two parts sits in the bottom right corner, beside the axis title, where
    // no bar or value label can reach.
    let (width, height) = area.dim_in_pixel();
    let key_style = TextStyle::from((FONT, LABEL_SIZE).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let key_y = i32::try_from(height).unwrap_or(i32::MAX).saturating_sub(12);
    let mut key_x = i32::try_from(width).unwrap_or(i32::MAX).saturating_sub(140);
    for (label, fill) in [("compute", COMPUTE_COLOR), ("egress", EGRESS_COLOR)] {
        area.draw(&Rectangle::new([(key_x, key_y - 5), (key_x + 10, key_y + 5)], fill.filled()))
            .map_err(drawing("the cost key"))?;
        area.draw(&Text::new(label, (key_x + 14, key_y), key_style.clone())).map_err(drawing("the cost key"))?;
        key_x += 72;
    }
    Ok(())
}

/// Maps a plotters error to a [`PlotError`] naming what was being drawn.
fn drawing<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> PlotError {
    move |error| PlotError::Draw(format!("{what}: {error}"))
}

/// The label of a delay-axis tick: `1s`, `10s`, `1m` … `1y`.
fn delay_label(secs: f64) -> String {
    DELAY_TICKS
        .iter()
        .find(|(tick, _)| (tick - secs).abs() <= tick * 1e-6)
        .map_or_else(|| format!("{secs:.0}s"), |(_, label)| (*label).to_owned())
}

/// The points of a CDF line: it rises from 0 at the first delay, then one point per sampled
/// rank, always including the last. At most [`MAX_CDF_POINTS`] + 1 points.
fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let count = sorted.len();
    let Some(first) = sorted.first() else { return Vec::new() };
    let samples = count.min(MAX_CDF_POINTS);
    let mut points = Vec::with_capacity(samples + 1);
    points.push((*first, 0.0));
    for sample in 0..samples {
        // Evenly spaced ranks from the first to the last; exact in integers.
        let rank = if samples > 1 { sample * (count - 1) / (samples - 1) } else { count - 1 };
        if let Some(secs) = sorted.get(rank) {
            points.push((*secs, (rank + 1) as f64 / count as f64));
        }
    }
    points
}

/// Delays with non-finite and negative values as zero, ascending.
fn clean_sorted(delays: &[f64]) -> Vec<f64> {
    let mut clean: Vec<f64> = delays.iter().copied().map(non_negative).collect();
    // Callers pass sorted delays; sorting again is cheap and keeps the line monotonic if not.
    clean.sort_by(f64::total_cmp);
    clean
}

/// `value` if finite and positive, else 0.
fn non_negative(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 { value } else { 0.0 }
}

/// The top of a value axis covering `largest` and its tick step: a 1, 2, 2.5 or 5 times a power
/// of ten, giving four or five ticks. Under $4 (or nothing to show) gives $0..$4 in $1 steps.
fn nice_axis(largest: f64) -> (f64, f64) {
    // Ticks are whole dollars, so a smaller axis would repeat its labels.
    if !largest.is_finite() || largest < 4.0 {
        return (4.0, 1.0);
    }
    let raw_step = largest / 4.0;
    let magnitude = 10f64.powf(raw_step.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|factor| factor * magnitude)
        .find(|step| *step >= raw_step)
        .unwrap_or(10.0 * magnitude);
    ((largest / step).ceil() * step, step)
}

/// Dollars in few characters for axis ticks and bar labels: `$0`, `$750`, `$2.5k`, `$12k`, `$1.2M`.
fn short_usd(amount: f64) -> String {
    let amount = non_negative(amount);
    let (scaled, suffix) = match amount {
        value if value < 999.5 => return format!("${value:.0}"),
        value if value < 999_500.0 => (value / 1e3, "k"),
        value if value < 999_500_000.0 => (value / 1e6, "M"),
        value => (value / 1e9, "B"),
    };
    let number = if scaled < 9.95 { format!("{scaled:.1}") } else { format!("{scaled:.0}") };
    format!("${}{suffix}", number.strip_suffix(".0").unwrap_or(&number))
}

/// `text` cut to `max_chars` characters, the last of them `…`, when longer.
fn shortened(text: &str, max_chars: usize) -> String {
    if text.chars().count() <= max_chars {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// The color of the `index`-th policy.
fn color(index: usize) -> RGBColor {
    PALETTE.get(index % PALETTE.len()).copied().unwrap_or(BLACK)
}

/// `text` with control characters as spaces: XML 1.0 forbids most of them even when escaped
/// (plotters escapes `<`, `>`, `&` and quotes itself).
fn printable(text: &str) -> String {
    text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn series(policy: &str, sorted_delays: Vec<f64>, compute_usd: f64, egress_usd: f64) -> PlotSeries {
        PlotSeries { policy: policy.to_owned(), sorted_delays, compute_usd, egress_usd }
    }

    /// The number of points of each CDF line (drawn 2 px wide; axes, grid and legend are not).
    fn points_of(svg: &str) -> Vec<usize> {
        svg.lines()
            .filter(|line| line.starts_with("<polyline") && line.contains("stroke-width=\"2\""))
            .map(|line| line.split("points=\"").nth(1).unwrap().split('"').next().unwrap().split_whitespace().count())
            .collect()
    }

    /// The texts of the document, in drawing order.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("</text>").filter_map(|chunk| chunk.rsplit_once(">\n")).map(|(_, text)| text.trim_end()).collect()
    }

    #[test]
    fn one_line_per_policy_in_a_complete_document() {
        let svg = render_svg(
            "Philly, 3 sites",
            &[
                series("meridian", vec![0.0, 5.0, 60.0, 3_600.0], 1_200.0, 300.0),
                series("home-only", vec![10.0, 100.0, 86_400.0], 0.0, 0.0),
                series("random", (0..10_000).map(f64::from).collect(), 5_000.0, 2_500.0),
            ],
        )
        .unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(points_of(&svg), [5, 4, MAX_CDF_POINTS + 1]);
        let texts = texts(&svg);
        for label in
            ["Philly, 3 sites", "Queueing delay CDF", "Cost per policy (US$)", "1s", "1h", "1d", "$7.5k", "$1.5k"]
        {
            assert!(texts.contains(&label), "no text {label:?} in {texts:?}");
        }
        for label in ["queueing delay (log scale)", "fraction of jobs", "US$", "compute", "egress"] {
            assert!(texts.contains(&label), "no axis title or key {label:?} in {texts:?}");
        }
        // Each policy is named twice: in the CDF legend and beside its bar.
        for policy in ["meridian", "home-only", "random"] {
            assert_eq!(texts.iter().filter(|text| **text == policy).count(), 2, "{policy} in {texts:?}");
        }
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn names_are_escaped_for_xml() {
        let svg = render_svg("a & <b>", &[series("<script>\"x\"", vec![1.0], 1.0, 0.0)]).unwrap();
        assert!(!svg.contains("<script>") && !svg.contains("<b>"));
        assert!(svg.contains("&lt;script&gt;&quot;x&quot;") && svg.contains("a &amp; &lt;b&gt;"));
        let control = render_svg("bell\u{7}", &[series("tab\tname", vec![1.0], 1.0, 0.0)]).unwrap();
        assert!(!control.contains('\u{7}') && !control.contains('\t'));
        assert!(control.contains("tab name"));
    }

    #[test]
    fn empty_and_all_zero_inputs_still_draw() {
        let empty = render_svg("nothing", &[]).unwrap();
        assert!(empty.starts_with("<svg") && empty.ends_with("</svg>\n"));
        assert!(points_of(&empty).is_empty());
        assert!(!empty.contains("NaN"));

        let zeros =
            render_svg("zeros", &[series("idle", vec![0.0; 1_000], 0.0, 0.0), series("none", vec![], 0.0, 0.0)])
                .unwrap();
        assert_eq!(points_of(&zeros).first(), Some(&(MAX_CDF_POINTS + 1)));
        assert!(points_of(&zeros).get(1).is_none_or(|points| *points == 0));
        assert!(!zeros.contains("NaN") && !zeros.contains("inf"));
        // Every zero delay sits on the 1 s line: one x for the whole line.
        let line = zeros.lines().find(|line| line.contains("stroke-width=\"2\"")).unwrap();
        let points = line.split("points=\"").nth(1).unwrap().split('"').next().unwrap();
        let xs: std::collections::BTreeSet<&str> =
            points.split_whitespace().map(|point| point.split(',').next().unwrap()).collect();
        assert_eq!(xs.len(), 1, "{points}");
    }

    #[test]
    fn output_is_deterministic() {
        let input =
            [series("a", vec![1.0, 2.0, 30.0], 10.0, 1.0), series("b", vec![f64::NAN, 4.0], -3.0, f64::INFINITY)];
        let svg = render_svg("t", &input).unwrap();
        assert_eq!(svg, render_svg("t", &input).unwrap());
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn delay_ticks_read_as_durations() {
        assert_eq!(delay_label(1.0), "1s");
        assert_eq!(delay_label(60.0), "1m");
        assert_eq!(delay_label(86_400.0), "1d");
        assert_eq!(delay_label(42.0), "42s");
    }

    #[test]
    fn axis_and_money_labels_are_round() {
        assert_eq!(nice_axis(0.0), (4.0, 1.0));
        assert_eq!(shortened("abcdef", 4), "abc…");
        assert_eq!(shortened("abc", 4), "abc");
        assert_eq!(nice_axis(7_500.0), (8_000.0, 2_000.0));
        assert_eq!(nice_axis(1_000.0), (1_000.0, 250.0));
        assert_eq!(short_usd(0.0), "$0");
        assert_eq!(short_usd(750.0), "$750");
        assert_eq!(short_usd(2_500.0), "$2.5k");
        assert_eq!(short_usd(12_345.0), "$12k");
        assert_eq!(short_usd(1_200_000.0), "$1.2M");
        assert_eq!(short_usd(5_000.0), "$5k");
    }
}
