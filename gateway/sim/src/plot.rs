//! A self-contained SVG chart comparing policies: the queueing-delay CDF of each (left) and what
//! each cost (right, compute and egress stacked).
//!
//! The SVG uses no scripts, external fonts or stylesheets, so it opens anywhere and can be
//! committed next to a report. Coordinates are printed with one decimal, so equal input gives
//! equal bytes.

/// Canvas width, px.
const WIDTH: f64 = 900.0;
/// Canvas height, px.
const HEIGHT: f64 = 420.0;
/// Top edge of both plot areas.
const PLOT_TOP: f64 = 60.0;
/// Bottom edge (the x axis) of both plot areas.
const PLOT_BOTTOM: f64 = 320.0;
/// Left and right edges of the CDF plot area.
const CDF_LEFT: f64 = 70.0;
const CDF_RIGHT: f64 = 440.0;
/// Left and right edges of the cost plot area.
const COST_LEFT: f64 = 540.0;
const COST_RIGHT: f64 = 880.0;
/// Most points drawn per CDF line; more would only grow the file.
const MAX_CDF_POINTS: usize = 400;
/// The x axis spans at least 1 s to this, so a run without waits still gets a readable axis.
const MIN_DELAY_AXIS_SECS: f64 = 10.0;
/// Approximate width of one legend character at 11 px, for sizing the legend's backdrop.
const LEGEND_CHAR_WIDTH: f64 = 6.5;
/// Longer policy names are cut under the bars, where they would run off the canvas.
const MAX_BAR_LABEL_CHARS: usize = 24;
/// Line colors, one per policy, repeating after ten (Tableau 10).
const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
/// Bar colors of the two cost parts.
const COMPUTE_COLOR: &str = "#4e79a7";
const EGRESS_COLOR: &str = "#f28e2b";
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

/// An SVG (self-contained, 900×420, no external fonts or scripts) with two panels.
///
/// Left: the queueing-delay CDF of each policy, x on a log scale from 1 s to the largest delay
/// (at least 10 s; delays under 1 s are drawn at 1 s), y from 0 to 1, one polyline per policy in
/// distinct colors, with a legend. Each line has at most ~400 points, evenly spaced in rank.
/// Right: total US$ per policy as bars, compute and egress stacked, with value labels.
/// Non-finite or negative inputs are drawn as zero.
pub fn render_svg(title: &str, series: &[PlotSeries]) -> String {
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"11\">\n"
    );
    svg.push_str(&format!("<rect width=\"{WIDTH}\" height=\"{HEIGHT}\" fill=\"#ffffff\"/>\n"));
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{}</text>\n",
        WIDTH / 2.0,
        escape(title)
    ));
    render_cdf_panel(series, &mut svg);
    render_cost_panel(series, &mut svg);
    svg.push_str("</svg>\n");
    svg
}

/// The left panel: axes, ticks, one CDF polyline per policy and the legend.
fn render_cdf_panel(series: &[PlotSeries], svg: &mut String) {
    let delays: Vec<Vec<f64>> = series.iter().map(|one| clean_sorted(&one.sorted_delays)).collect();
    let largest = delays.iter().filter_map(|one| one.last().copied()).fold(0.0, f64::max);
    let axis_max = largest.max(MIN_DELAY_AXIS_SECS);
    let x_of = |secs: f64| CDF_LEFT + secs.max(1.0).log10() / axis_max.log10() * (CDF_RIGHT - CDF_LEFT);
    let y_of = |fraction: f64| PLOT_BOTTOM - fraction * (PLOT_BOTTOM - PLOT_TOP);

    panel_title(CDF_LEFT, "Queueing delay CDF", svg);
    for (secs, label) in DELAY_TICKS.iter().filter(|(secs, _)| *secs <= axis_max * 1.000_001) {
        let x = x_of(*secs);
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{PLOT_TOP:.1}\" x2=\"{x:.1}\" y2=\"{PLOT_BOTTOM:.1}\" stroke=\"#e5e5e5\"/>\n"
        ));
        svg.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>\n",
            PLOT_BOTTOM + 16.0
        ));
    }
    for quarter in 0..=4 {
        let fraction = f64::from(quarter) / 4.0;
        let y = y_of(fraction);
        svg.push_str(&format!(
            "<line x1=\"{CDF_LEFT:.1}\" y1=\"{y:.1}\" x2=\"{CDF_RIGHT:.1}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/>\n"
        ));
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{fraction:.2}</text>\n",
            CDF_LEFT - 6.0,
            y + 4.0
        ));
    }
    axes(CDF_LEFT, CDF_RIGHT, svg);
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">queueing delay (log scale)</text>\n",
        (CDF_LEFT + CDF_RIGHT) / 2.0,
        PLOT_BOTTOM + 36.0
    ));
    svg.push_str(&format!(
        "<text transform=\"translate(22 {:.1}) rotate(-90)\" text-anchor=\"middle\">fraction of jobs</text>\n",
        (PLOT_TOP + PLOT_BOTTOM) / 2.0
    ));

    for (index, (one, sorted)) in series.iter().zip(&delays).enumerate() {
        let points: Vec<String> = cdf_points(sorted)
            .into_iter()
            .map(|(secs, fraction)| format!("{:.1},{:.1}", x_of(secs), y_of(fraction)))
            .collect();
        svg.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\" points=\"{}\"><title>{}</title></polyline>\n",
            color(index),
            points.join(" "),
            escape(&one.policy)
        ));
    }

    // Bottom right stays empty in a CDF: every line has risen by the time it gets there.
    let legend_top = PLOT_BOTTOM - 10.0 - 15.0 * series.len() as f64;
    let longest_name = series.iter().map(|one| one.policy.chars().count()).max().unwrap_or(0);
    let legend_width = (30.0 + LEGEND_CHAR_WIDTH * longest_name as f64).min(CDF_RIGHT - CDF_LEFT);
    if !series.is_empty() {
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{legend_width:.1}\" height=\"{:.1}\" fill=\"#ffffff\" \
             fill-opacity=\"0.85\"/>\n",
            CDF_RIGHT - legend_width,
            legend_top - 9.0,
            15.0 * series.len() as f64 + 4.0
        ));
    }
    for (index, one) in series.iter().enumerate() {
        let y = legend_top + 15.0 * index as f64;
        let x = CDF_RIGHT - legend_width + 6.0;
        svg.push_str(&format!(
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"{}\" stroke-width=\"3\"/>\n",
            x + 18.0,
            color(index)
        ));
        svg.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n", x + 24.0, y + 4.0, escape(&one.policy)));
    }
}

/// The right panel: one stacked bar per policy with its total above it.
fn render_cost_panel(series: &[PlotSeries], svg: &mut String) {
    let costs: Vec<(f64, f64)> =
        series.iter().map(|one| (non_negative(one.compute_usd), non_negative(one.egress_usd))).collect();
    let largest = costs.iter().map(|(compute, egress)| compute + egress).fold(0.0, f64::max);
    let (axis_max, step) = nice_axis(largest);
    let y_of = |usd: f64| PLOT_BOTTOM - usd / axis_max * (PLOT_BOTTOM - PLOT_TOP);

    panel_title(COST_LEFT, "Cost per policy (US$)", svg);
    for (part, (label, fill)) in [("compute", COMPUTE_COLOR), ("egress", EGRESS_COLOR)].iter().enumerate() {
        let x = COST_RIGHT - 140.0 + 70.0 * part as f64;
        svg.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{fill}\"/>\n",
            PLOT_TOP - 21.0
        ));
        svg.push_str(&format!("<text x=\"{:.1}\" y=\"{:.1}\">{label}</text>\n", x + 14.0, PLOT_TOP - 12.0));
    }
    let mut tick = 0.0;
    while tick <= axis_max * 1.000_001 {
        let y = y_of(tick);
        svg.push_str(&format!(
            "<line x1=\"{COST_LEFT:.1}\" y1=\"{y:.1}\" x2=\"{COST_RIGHT:.1}\" y2=\"{y:.1}\" stroke=\"#e5e5e5\"/>\n"
        ));
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>\n",
            COST_LEFT - 6.0,
            y + 4.0,
            short_usd(tick)
        ));
        tick += step;
    }
    axes(COST_LEFT, COST_RIGHT, svg);

    let slot = (COST_RIGHT - COST_LEFT) / series.len().max(1) as f64;
    let bar_width = slot * 0.6;
    for (index, (one, (compute, egress))) in series.iter().zip(&costs).enumerate() {
        let left = COST_LEFT + slot * index as f64 + (slot - bar_width) / 2.0;
        let center = left + bar_width / 2.0;
        let compute_top = y_of(*compute);
        let total_top = y_of(compute + egress);
        svg.push_str(&format!(
            "<rect x=\"{left:.1}\" y=\"{compute_top:.1}\" width=\"{bar_width:.1}\" height=\"{:.1}\" fill=\"{COMPUTE_COLOR}\"/>\n",
            PLOT_BOTTOM - compute_top
        ));
        svg.push_str(&format!(
            "<rect x=\"{left:.1}\" y=\"{total_top:.1}\" width=\"{bar_width:.1}\" height=\"{:.1}\" fill=\"{EGRESS_COLOR}\"/>\n",
            compute_top - total_top
        ));
        svg.push_str(&format!(
            "<text x=\"{center:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{}</text>\n",
            total_top - 4.0,
            short_usd(compute + egress)
        ));
        svg.push_str(&format!(
            "<text transform=\"translate({center:.1} {:.1}) rotate(-30)\" text-anchor=\"end\">{}</text>\n",
            PLOT_BOTTOM + 14.0,
            escape(&shortened(&one.policy, MAX_BAR_LABEL_CHARS))
        ));
    }
}

/// A panel's heading above its top-left corner.
fn panel_title(left: f64, text: &str, svg: &mut String) {
    svg.push_str(&format!(
        "<text x=\"{left:.1}\" y=\"{:.1}\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
        PLOT_TOP - 12.0,
        escape(text)
    ));
}

/// The left and bottom axis lines of a plot area.
fn axes(left: f64, right: f64, svg: &mut String) {
    svg.push_str(&format!(
        "<polyline fill=\"none\" stroke=\"#333333\" points=\"{left:.1},{PLOT_TOP:.1} {left:.1},{PLOT_BOTTOM:.1} \
         {right:.1},{PLOT_BOTTOM:.1}\"/>\n"
    ));
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
fn color(index: usize) -> &'static str {
    PALETTE.get(index % PALETTE.len()).copied().unwrap_or("#000000")
}

/// `text` safe inside XML elements and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 forbids most control characters even when escaped.
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn series(policy: &str, sorted_delays: Vec<f64>, compute_usd: f64, egress_usd: f64) -> PlotSeries {
        PlotSeries { policy: policy.to_owned(), sorted_delays, compute_usd, egress_usd }
    }

    fn points_of(svg: &str) -> Vec<usize> {
        svg.lines()
            .filter(|line| line.starts_with("<polyline fill=\"none\" stroke=\"#") && line.contains("<title>"))
            .map(|line| line.split("points=\"").nth(1).unwrap().split('"').next().unwrap().split_whitespace().count())
            .collect()
    }

    #[test]
    fn one_polyline_per_policy_in_a_complete_document() {
        let svg = render_svg(
            "Philly, 3 sites",
            &[
                series("meridian", vec![0.0, 5.0, 60.0, 3_600.0], 1_200.0, 300.0),
                series("home-only", vec![10.0, 100.0, 86_400.0], 0.0, 0.0),
                series("random", (0..10_000).map(f64::from).collect(), 5_000.0, 2_500.0),
            ],
        );
        assert!(svg.starts_with("<svg"));
        assert!(svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 3 + 2, "three CDFs and two pairs of axes");
        assert_eq!(points_of(&svg), [5, 4, MAX_CDF_POINTS + 1]);
        assert!(svg.contains(">1d</text>") && svg.contains(">1h</text>") && svg.contains(">1s</text>"));
        assert!(svg.contains(">$7.5k</text>") && svg.contains(">$1.5k</text>"), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }

    #[test]
    fn names_are_escaped_for_xml() {
        let svg = render_svg("a & <b>", &[series("<script>\"x\"", vec![1.0], 1.0, 0.0)]);
        assert!(!svg.contains("<script>") && !svg.contains("<b>"));
        assert!(svg.contains("&lt;script&gt;&quot;x&quot;") && svg.contains("a &amp; &lt;b&gt;"));
    }

    #[test]
    fn empty_and_all_zero_inputs_still_draw() {
        let empty = render_svg("nothing", &[]);
        assert!(empty.starts_with("<svg") && empty.ends_with("</svg>\n"));
        assert_eq!(points_of(&empty).len(), 0);
        assert!(!empty.contains("NaN"));

        let zeros =
            render_svg("zeros", &[series("idle", vec![0.0; 1_000], 0.0, 0.0), series("none", vec![], 0.0, 0.0)]);
        assert_eq!(points_of(&zeros), [MAX_CDF_POINTS + 1, 0]);
        assert!(!zeros.contains("NaN") && !zeros.contains("inf"));
        // Every zero delay sits on the 1 s line at the left edge.
        assert!(zeros.contains(&format!("{CDF_LEFT:.1},{PLOT_BOTTOM:.1} {CDF_LEFT:.1},")));
    }

    #[test]
    fn output_is_deterministic() {
        let input =
            [series("a", vec![1.0, 2.0, 30.0], 10.0, 1.0), series("b", vec![f64::NAN, 4.0], -3.0, f64::INFINITY)];
        assert_eq!(render_svg("t", &input), render_svg("t", &input));
        assert!(!render_svg("t", &input).contains("NaN"));
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
