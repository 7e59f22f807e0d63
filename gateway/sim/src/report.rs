//! A simulation's results for people and for programs: aligned text tables and JSON.
//!
//! One run prints a summary and its breakdowns (job size, tenant, cluster); several runs (the
//! `--compare` mode) print one row per policy, ratios against the `meridian` run, and the tail
//! delay of each job size. Output depends only on the report, so the same run prints the same
//! bytes.

use serde::Serialize;

use meridian_proto::inventory::Tier;

use super::SizeBucket;
use super::metrics::{Metrics, Stats};
use meridian_cli::table::{Table, key_values};

/// The policy the ratio table divides by.
const BASELINE_POLICY: &str = "meridian";

/// GB in a TB (decimal units, as the moved-data figures are).
const GB_PER_TB: f64 = 1_000.0;

/// Everything a `meridian sim` invocation measured, with what it ran on.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The topology file or its name.
    pub topology: String,
    /// Where the workload came from ([`super::Workload::source`]).
    pub workload: String,
    /// Seed of the random decisions.
    pub seed: u64,
    /// Jobs in the workload.
    pub jobs: usize,
    /// Tenants in the workload.
    pub tenants: usize,
    /// Demanded GPU-seconds ÷ (fleet GPUs × submission span).
    pub offered_load: f64,
    /// One per policy, in the order they ran.
    pub runs: Vec<Metrics>,
}

/// How a table column lines up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// The report as pretty-printed JSON with a trailing newline. Field order follows the types and
/// maps are sorted, so equal reports give equal bytes.
pub fn to_json(report: &Report) -> Result<String, serde_json::Error> {
    let mut json = serde_json::to_string_pretty(report)?;
    json.push('\n');
    Ok(json)
}

/// The report as human-readable tables: a header line, then either one run's summary and
/// breakdowns or, for several runs, the side-by-side comparison.
pub fn render_table(report: &Report) -> String {
    let mut out = format!(
        "topology {} | workload {} | {} jobs | {} tenants | offered load {:.2} | seed {}\n",
        report.topology,
        report.workload,
        grouped(report.jobs as f64, 0),
        grouped(report.tenants as f64, 0),
        report.offered_load,
        report.seed,
    );
    match report.runs.as_slice() {
        [] => out.push_str("\nno runs\n"),
        [run] => render_single(run, &mut out),
        runs => render_comparison(runs, &mut out),
    }
    render_deadlines(&report.runs, &mut out);
    out
}

/// With `--deadlines` only (so other reports keep their bytes): per policy, jobs with a deadline,
/// how many missed it, and what those jobs spent on cloud clusters.
fn render_deadlines(runs: &[Metrics], out: &mut String) {
    if runs.iter().all(|run| run.deadlines.is_none()) {
        return;
    }
    out.push_str(
        "
deadlines (only meridian reads them; the baselines place due jobs like any other)
",
    );
    let mut table = aligned_table(&[
        ("POLICY", Align::Left),
        ("DUE JOBS", Align::Right),
        ("MISSED", Align::Right),
        ("MISS %", Align::Right),
        ("DUE ON CLOUD", Align::Right),
        ("CLOUD $ (DUE)", Align::Right),
    ]);
    for run in runs {
        let Some(d) = &run.deadlines else { continue };
        table.row(vec![
            run.policy.clone(),
            grouped(d.jobs as f64, 0),
            grouped(d.misses as f64, 0),
            percent(d.miss_fraction),
            grouped(d.cloud_jobs as f64, 0),
            dollars(d.cloud_usd),
        ]);
    }
    out.push_str(&table.render());
}

/// Summary and breakdowns of one run.
fn render_single(run: &Metrics, out: &mut String) {
    let overall = &run.overall;
    out.push('\n');
    let mut rows = vec![
        ("Policy", run.policy.clone()),
        ("Jobs", grouped(overall.jobs as f64, 0)),
        (
            "Queueing delay",
            format!(
                "mean {}, p50 {}, p99 {}",
                duration(overall.queue_mean_secs),
                duration(overall.queue_p50_secs),
                duration(overall.queue_p99_secs)
            ),
        ),
        (
            "Completion time",
            format!("mean {}, p99 {}", duration(overall.jct_mean_secs), duration(overall.jct_p99_secs)),
        ),
        ("Slowdown", format!("mean {:.2}, p99 {:.2}", overall.slowdown_mean, overall.slowdown_p99)),
        ("Makespan", duration(run.makespan_secs)),
        (
            "Cost",
            format!(
                "{} (compute {}, egress {})",
                dollars(run.total_usd),
                dollars(run.compute_usd),
                dollars(run.egress_usd)
            ),
        ),
        ("GPU-hours", format!("{} ({} cloud)", grouped(run.gpu_hours, 1), grouped(run.cloud_gpu_hours, 1))),
        ("Data moved", data_size(run.moved_gb)),
        ("Burst fraction", percent(run.burst_fraction)),
        ("Jain fairness", format!("{:.3}", run.jain_fairness)),
        ("Events", grouped(run.events as f64, 0)),
    ];
    if let Some(gateway) = &run.gateway {
        rows.push((
            "Gateway",
            format!(
                "{} rounds, {} offers ({} declined, {} staging data), {} cancels, {} records",
                grouped(gateway.rounds as f64, 0),
                grouped(gateway.offers as f64, 0),
                grouped(gateway.declined as f64, 0),
                grouped(gateway.staged as f64, 0),
                grouped(gateway.cancels as f64, 0),
                grouped(gateway.records as f64, 0),
            ),
        ));
    }
    out.push_str(&key_values(&rows));

    out.push('\n');
    out.push_str(&stats_table("SIZE", run.per_size.iter().map(|(bucket, stats)| (bucket.to_string(), stats))));
    out.push('\n');
    out.push_str(&stats_table("TENANT", run.per_tenant.iter().map(|(name, stats)| (name.clone(), stats))));

    out.push('\n');
    let mut clusters = aligned_table(&[
        ("CLUSTER", Align::Left),
        ("TIER", Align::Left),
        ("GPUS", Align::Right),
        ("UTILISATION", Align::Right),
        ("GPU-HOURS", Align::Right),
    ]);
    for cluster in &run.clusters {
        clusters.row(vec![
            cluster.name.clone(),
            tier_name(cluster.tier).to_owned(),
            grouped(cluster.gpus as f64, 0),
            percent(cluster.utilisation),
            grouped(cluster.gpu_hours, 1),
        ]);
    }
    out.push_str(&clusters.render());
}

/// One row per policy, ratios against `meridian`, and per-size tail delays.
fn render_comparison(runs: &[Metrics], out: &mut String) {
    let columns = comparison_columns();
    let headers: Vec<(&str, Align)> = std::iter::once(("POLICY", Align::Left))
        .chain(columns.iter().map(|column| (column.header, Align::Right)))
        .collect();

    out.push('\n');
    let mut side_by_side = aligned_table(&headers);
    for run in runs {
        side_by_side.row(
            std::iter::once(run.policy.clone())
                .chain(columns.iter().map(|column| (column.format)((column.value)(run)))),
        );
    }
    out.push_str(&side_by_side.render());

    if let Some(baseline) = runs.iter().find(|run| run.policy == BASELINE_POLICY) {
        out.push_str(&format!("\nratio to {BASELINE_POLICY} (lower is better, except Jain fairness)\n"));
        let mut ratios = aligned_table(&headers);
        for run in runs {
            ratios.row(
                std::iter::once(run.policy.clone())
                    .chain(columns.iter().map(|column| ratio_cell((column.value)(run), (column.value)(baseline)))),
            );
        }
        out.push_str(&ratios.render());
    }

    let buckets: Vec<SizeBucket> =
        SizeBucket::ALL.into_iter().filter(|bucket| runs.iter().any(|run| run.per_size.contains_key(bucket))).collect();
    out.push_str("\np99 queueing delay by job size\n");
    let bucket_names: Vec<String> = buckets.iter().map(ToString::to_string).collect();
    let size_headers: Vec<(&str, Align)> = std::iter::once(("POLICY", Align::Left))
        .chain(bucket_names.iter().map(|name| (name.as_str(), Align::Right)))
        .collect();
    let mut by_size = aligned_table(&size_headers);
    for run in runs {
        by_size.row(std::iter::once(run.policy.clone()).chain(buckets.iter().map(|bucket| {
            run.per_size.get(bucket).map_or_else(|| "-".to_owned(), |stats| duration(stats.queue_p99_secs))
        })));
    }
    out.push_str(&by_size.render());
}

/// A metric of the comparison: its header, how to read it from a run and how to print it.
struct Column {
    header: &'static str,
    value: fn(&Metrics) -> f64,
    format: fn(f64) -> String,
}

/// The comparison's metric columns, shared by the side-by-side and the ratio tables.
fn comparison_columns() -> [Column; 11] {
    [
        Column { header: "QUEUE MEAN", value: |run| run.overall.queue_mean_secs, format: duration },
        Column { header: "P50", value: |run| run.overall.queue_p50_secs, format: duration },
        Column { header: "P99", value: |run| run.overall.queue_p99_secs, format: duration },
        Column { header: "JCT MEAN", value: |run| run.overall.jct_mean_secs, format: duration },
        Column { header: "JCT P99", value: |run| run.overall.jct_p99_secs, format: duration },
        Column { header: "SLOWDOWN", value: |run| run.overall.slowdown_mean, format: |value| format!("{value:.2}") },
        Column { header: "TOTAL $", value: |run| run.total_usd, format: dollars },
        Column { header: "CLOUD GPU-H", value: |run| run.cloud_gpu_hours, format: |value| grouped(value, 1) },
        Column { header: "MOVED TB", value: |run| run.moved_gb / GB_PER_TB, format: |value| format!("{value:.2}") },
        Column { header: "BURST %", value: |run| run.burst_fraction, format: percent },
        Column { header: "JAIN", value: |run| run.jain_fairness, format: |value| format!("{value:.3}") },
    ]
}

/// A breakdown of [`Stats`] keyed by the first column.
fn stats_table<'a>(key_header: &str, groups: impl Iterator<Item = (String, &'a Stats)>) -> String {
    let mut table = aligned_table(&[
        (key_header, Align::Left),
        ("JOBS", Align::Right),
        ("QUEUE MEAN", Align::Right),
        ("P50", Align::Right),
        ("P99", Align::Right),
        ("JCT MEAN", Align::Right),
        ("JCT P99", Align::Right),
        ("SLOWDOWN MEAN", Align::Right),
        ("SLOWDOWN P99", Align::Right),
    ]);
    for (key, stats) in groups {
        table.row(vec![
            key,
            grouped(stats.jobs as f64, 0),
            duration(stats.queue_mean_secs),
            duration(stats.queue_p50_secs),
            duration(stats.queue_p99_secs),
            duration(stats.jct_mean_secs),
            duration(stats.jct_p99_secs),
            format!("{:.2}", stats.slowdown_mean),
            format!("{:.2}", stats.slowdown_p99),
        ]);
    }
    table.render()
}

/// A [`Table`] with these headers, its [`Align::Right`] columns aligned to the right.
fn aligned_table(headers: &[(&str, Align)]) -> Table {
    let mut table = Table::new(headers.iter().map(|(name, _)| *name));
    for (index, _) in headers.iter().enumerate().filter(|(_, (_, align))| *align == Align::Right) {
        table.align_right(index);
    }
    table
}

/// `value ÷ baseline` as `×1.23`; equal zeros read `×1.00` and any other zero denominator `-`.
fn ratio_cell(value: f64, baseline: f64) -> String {
    if baseline == 0.0 {
        return if value == 0.0 { "×1.00".to_owned() } else { "-".to_owned() };
    }
    let ratio = value / baseline;
    if ratio.is_finite() { format!("×{ratio:.2}") } else { "-".to_owned() }
}

/// Seconds in their largest whole unit with one decimal: `0s`, `42s`, `3.5m`, `2.1h`, `1.3d`.
/// Under half a second but above zero reads `<1s`; negative reads `0s`; not-a-number `-`.
fn duration(secs: f64) -> String {
    if secs.is_nan() {
        return "-".to_owned();
    }
    let secs = secs.max(0.0);
    if secs > 0.0 && secs < 0.5 {
        return "<1s".to_owned();
    }
    // Each unit is used while its rounded value stays below the next unit, so 59.7 s reads
    // `1.0m`, not `60s`.
    if secs.round() < 60.0 {
        return format!("{:.0}s", secs.round());
    }
    let minutes = secs / 60.0;
    if (minutes * 10.0).round() < 600.0 {
        return format!("{minutes:.1}m");
    }
    let hours = secs / 3_600.0;
    if (hours * 10.0).round() < 240.0 {
        return format!("{hours:.1}h");
    }
    format!("{:.1}d", secs / 86_400.0)
}

/// Whole US dollars with thousands separators: `$12,345`; a non-zero amount under a dollar
/// reads `<$1`.
fn dollars(amount: f64) -> String {
    if amount > 0.0 && amount < 0.5 {
        return "<$1".to_owned();
    }
    let sign = if amount <= -0.5 { "-" } else { "" };
    format!("{sign}${}", grouped(amount.abs(), 0))
}

/// A fraction as a percentage with one decimal: `12.5%`.
fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// GB as `456.7 GB` below a TB and `1.23 TB` from there on.
fn data_size(gb: f64) -> String {
    if gb < GB_PER_TB { format!("{gb:.1} GB") } else { format!("{:.2} TB", gb / GB_PER_TB) }
}

/// `owned` or `cloud`, as in the topology file.
fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Owned => "owned",
        Tier::Cloud => "cloud",
    }
}

/// A non-negative number with `decimals` decimals and commas between thousands: `12,345.6`.
fn grouped(value: f64, decimals: usize) -> String {
    if !value.is_finite() {
        return "-".to_owned();
    }
    let text = format!("{:.decimals$}", value.abs());
    let (whole, fraction) =
        text.split_once('.').map_or((text.as_str(), None), |(whole, fraction)| (whole, Some(fraction)));
    let mut out = String::new();
    if value < 0.0 && text.chars().any(|c| c != '0' && c != '.') {
        out.push('-');
    }
    let digits = whole.len();
    for (index, digit) in whole.chars().enumerate() {
        if index > 0 && (digits - index) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if let Some(fraction) = fraction {
        out.push('.');
        out.push_str(fraction);
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metrics::ClusterMetrics;

    fn stats(queue_mean: f64) -> Stats {
        Stats {
            jobs: 10,
            queue_mean_secs: queue_mean,
            queue_p50_secs: queue_mean / 2.0,
            queue_p99_secs: queue_mean * 4.0,
            jct_mean_secs: queue_mean + 600.0,
            jct_p99_secs: queue_mean * 4.0 + 3_600.0,
            slowdown_mean: 1.5,
            slowdown_p99: 6.0,
        }
    }

    fn metrics(policy: &str, queue_mean: f64, total_usd: f64) -> Metrics {
        Metrics {
            policy: policy.to_owned(),
            overall: stats(queue_mean),
            per_tenant: BTreeMap::from([("zeta".to_owned(), stats(queue_mean)), ("alpha".to_owned(), stats(1.0))]),
            per_size: BTreeMap::from([(SizeBucket::One, stats(queue_mean)), (SizeBucket::Large, stats(7_200.0))]),
            makespan_secs: 86_400.0 * 3.0,
            clusters: vec![
                ClusterMetrics {
                    name: "onprem".to_owned(),
                    tier: Tier::Owned,
                    gpus: 64,
                    utilisation: 0.75,
                    gpu_hours: 1_234.5,
                },
                ClusterMetrics {
                    name: "aws".to_owned(),
                    tier: Tier::Cloud,
                    gpus: 32,
                    utilisation: 0.1,
                    gpu_hours: 20.0,
                },
            ],
            gpu_hours: 1_254.5,
            cloud_gpu_hours: 20.0,
            compute_usd: total_usd * 0.75,
            egress_usd: total_usd * 0.25,
            total_usd,
            moved_gb: 2_500.0,
            burst_fraction: 0.125,
            jain_fairness: 0.9,
            events: 1_000,
            gateway: None,
            deadlines: None,
        }
    }

    fn report(runs: Vec<Metrics>) -> Report {
        Report {
            topology: "three-sites.yaml".to_owned(),
            workload: "philly.csv".to_owned(),
            seed: 7,
            jobs: 82_247,
            tenants: 14,
            offered_load: 0.85,
            runs,
        }
    }

    #[test]
    fn json_is_deterministic_and_camel_case() {
        let report = report(vec![metrics("meridian", 60.0, 1_000.0), metrics("random", 90.0, 2_000.0)]);
        let first = to_json(&report).unwrap();
        assert_eq!(first, to_json(&report).unwrap());
        assert!(first.ends_with("}\n"));
        let value: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(value["runs"][0]["overall"]["queueMeanSecs"], 60.0);
        assert_eq!(value["runs"][1]["policy"], "random");
        assert_eq!(value["offeredLoad"], 0.85);
        assert!(value["runs"][0]["perSize"]["65+"].is_object());
    }

    #[test]
    fn comparison_shows_every_policy_and_ratios_to_meridian() {
        let text = render_table(&report(vec![
            metrics("meridian", 60.0, 1_000.0),
            metrics("home-only", 90.0, 2_500.0),
            metrics("<odd>", 0.0, 0.0),
        ]));
        assert!(text.contains("82,247 jobs"), "{text}");
        for policy in ["meridian", "home-only", "<odd>"] {
            assert!(text.contains(policy), "{text}");
        }
        let ratio_section = text.split("ratio to meridian").nth(1).unwrap();
        let meridian_row = ratio_section.lines().find(|line| line.starts_with("meridian")).unwrap();
        assert_eq!(meridian_row.matches("×1.00").count(), 11, "{meridian_row}");
        let home_row = ratio_section.lines().find(|line| line.starts_with("home-only")).unwrap();
        // Queue mean 90 s ÷ 60 s and $2,500 ÷ $1,000.
        assert!(home_row.contains("×1.50") && home_row.contains("×2.50"), "{home_row}");
        assert!(text.contains("$2,500"), "{text}");
        assert!(text.contains("p99 queueing delay by job size"));
        assert!(text.contains("65+ GPUs") && text.contains("8.0h"), "{text}");
    }

    #[test]
    fn the_deadline_table_appears_only_when_runs_measured_deadlines() {
        let plain = render_table(&report(vec![metrics("meridian", 60.0, 1_000.0), metrics("random", 90.0, 2.0)]));
        assert!(!plain.contains("deadlines"), "{plain}");
        let mut due = metrics("meridian", 60.0, 1_000.0);
        due.deadlines = Some(crate::deadline::DeadlineMetrics {
            jobs: 1_200,
            misses: 30,
            miss_fraction: 0.025,
            cloud_jobs: 80,
            cloud_usd: 4_321.0,
        });
        let text = render_table(&report(vec![due, metrics("random", 90.0, 2.0)]));
        let section = text.split("deadlines (only meridian").nth(1).unwrap();
        let row = section.lines().find(|line| line.starts_with("meridian")).unwrap();
        for cell in ["1,200", "30", "2.5%", "80", "$4,321"] {
            assert!(row.contains(cell), "{row}");
        }
        assert!(text.lines().all(|line| line == line.trim_end()));
    }

    #[test]
    fn comparison_without_meridian_skips_the_ratio_table() {
        let text = render_table(&report(vec![metrics("fifo", 60.0, 1.0), metrics("random", 90.0, 2.0)]));
        assert!(!text.contains("ratio to"));
        assert!(text.contains("fifo") && text.contains("random"));
    }

    #[test]
    fn single_run_shows_summary_and_breakdowns() {
        let text = render_table(&report(vec![metrics("meridian", 150.0, 12_345.0)]));
        assert!(text.contains("zeta") && text.contains("alpha"), "{text}");
        assert!(text.find("alpha").unwrap() < text.find("zeta").unwrap());
        assert!(text.contains("$12,345 (compute $9,259, egress $3,086)"), "{text}");
        assert!(text.contains("2.50 TB"), "{text}");
        assert!(text.contains("12.5%") && text.contains("0.900"), "{text}");
        assert!(
            text.contains("onprem") && text.contains("cloud") && text.contains("75.0%") && text.contains("1,234.5")
        );
        assert!(text.contains("1 GPU") && text.contains("65+ GPUs"));
        assert!(!text.contains("ratio to"));
        assert!(text.lines().all(|line| line == line.trim_end()));
    }

    #[test]
    fn numeric_columns_are_right_aligned() {
        let mut table = aligned_table(&[("NAME", Align::Left), ("N", Align::Right)]);
        table.row(vec!["a".to_owned(), "5".to_owned()]);
        table.row(vec!["bb".to_owned(), "1,000".to_owned()]);
        assert_eq!(table.render(), "NAME       N\na          5\nbb     1,000\n");
    }

    #[test]
    fn numbers_read_as_people_write_them() {
        assert_eq!(duration(0.0), "0s");
        assert_eq!(duration(0.2), "<1s");
        assert_eq!(duration(42.0), "42s");
        assert_eq!(duration(59.7), "1.0m");
        assert_eq!(duration(210.0), "3.5m");
        assert_eq!(duration(2.1 * 3_600.0), "2.1h");
        assert_eq!(duration(1.3 * 86_400.0), "1.3d");
        assert_eq!(duration(f64::NAN), "-");
        assert_eq!(dollars(12_345.4), "$12,345");
        assert_eq!(dollars(0.0), "$0");
        assert_eq!(dollars(0.3), "<$1");
        assert_eq!(dollars(999.6), "$1,000");
        assert_eq!(grouped(1_234_567.891, 1), "1,234,567.9");
        assert_eq!(grouped(12.0, 0), "12");
        assert_eq!(ratio_cell(3.0, 2.0), "×1.50");
        assert_eq!(ratio_cell(3.0, 0.0), "-");
        assert_eq!(ratio_cell(0.0, 0.0), "×1.00");
        assert_eq!(data_size(456.74), "456.7 GB");
    }
}
