//! The Philly trace reader: one CSV row per job, `timestamp,duration,num_gpus,gpu_time,cluster`.
//!
//! The rules were checked against the real file (82,247 rows, Aug–Dec 2017): every row has five
//! columns, a well-formed timestamp, a whole positive duration, a whole GPU count of at least 1,
//! and a `gpu_time` exactly equal to `duration × num_gpus`. So the reader keeps every rule strict
//! and stops at the first row that breaks one, naming the line, the column and the value.

use std::path::Path;

use crate::{RawJob, SimError};

/// The header line the reader requires.
const HEADER: &str = "timestamp,duration,num_gpus,gpu_time,cluster";

/// Columns in a row.
const COLUMNS: usize = 5;

/// Longest run time accepted, in seconds (about 32 years). The trace's longest job is 4.6 million
/// seconds; the bound keeps GPU-second sums downstream far from `u64` overflow.
const MAX_DURATION_SECS: f64 = 1e9;

/// Relative tolerance between `gpu_time` and `duration × num_gpus`...
const GPU_TIME_RELATIVE_TOLERANCE: f64 = 0.01;

/// ...or this many GPU-seconds, whichever is larger (float formatting of short jobs).
const GPU_TIME_ABSOLUTE_TOLERANCE: f64 = 1.0;

/// Longest value quoted in an error message; a garbled row should not flood the terminal.
const MAX_QUOTED_CHARS: usize = 60;

/// Parses a Philly CSV held in memory. `path` only names the file in errors.
///
/// Returns the jobs sorted by submit time (ties keep file order), rebased so the earliest submits
/// at 0. Errors with [`SimError::Trace`] at the first malformed line (wrong header, wrong column
/// count, a bad value, a `gpu_time` that disagrees with `duration × num_gpus`), or when there are
/// no rows. Blank lines are skipped.
pub fn parse_philly(text: &str, path: &Path) -> Result<Vec<RawJob>, SimError> {
    let trace_error = |line: usize, message: String| SimError::Trace { path: path.to_path_buf(), line, message };
    let mut lines = text.split('\n');
    let header = lines.next().unwrap_or_default();
    let header = header.strip_prefix('\u{feff}').unwrap_or(header);
    let header = header.strip_suffix('\r').unwrap_or(header);
    if header != HEADER {
        return Err(trace_error(1, format!("expected the header `{HEADER}`, got `{}`", quoted(header))));
    }

    // Rows run about 42 bytes; a close guess saves the vector's regrowth.
    let mut stamped: Vec<(i64, RawJob)> = Vec::with_capacity(text.len() / 40);
    for (index, line) in lines.enumerate() {
        let line_number = index + 2;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let row = parse_row(line).map_err(|message| trace_error(line_number, message))?;
        stamped.push(row);
    }
    if stamped.is_empty() {
        return Err(trace_error(1, "no jobs: the file has a header but no rows".to_string()));
    }

    // Stable, so jobs submitted in the same second keep their file order.
    stamped.sort_by_key(|(submit, _)| *submit);
    let earliest = stamped.first().map_or(0, |(submit, _)| *submit);
    Ok(stamped
        .into_iter()
        .map(|(submit, mut job)| {
            job.submit_secs = submit.abs_diff(earliest);
            job
        })
        .collect())
}

/// Reads and parses a Philly CSV file; see [`parse_philly`]. A file that cannot be read (or is
/// not UTF-8) is [`SimError::Io`].
pub fn read_philly(path: &Path) -> Result<Vec<RawJob>, SimError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimError::Io { path: path.to_path_buf(), source })?;
    parse_philly(&text, path)
}

/// One row: its submit time in seconds since 1970 and the job (with `submit_secs` still 0).
fn parse_row(line: &str) -> Result<(i64, RawJob), String> {
    let mut columns = line.split(',');
    let (Some(timestamp), Some(duration), Some(num_gpus), Some(gpu_time), Some(cluster), None) =
        (columns.next(), columns.next(), columns.next(), columns.next(), columns.next(), columns.next())
    else {
        return Err(format!("expected {COLUMNS} columns (`{HEADER}`), found {}", line.split(',').count()));
    };

    let submit = parse_timestamp(timestamp.trim())?;

    let duration = duration.trim();
    let duration_secs = match duration.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs > 0.0 && secs <= MAX_DURATION_SECS => secs,
        _ => {
            return Err(format!(
                "column `duration`: expected seconds, a number > 0 and <= {MAX_DURATION_SECS:e}, got `{}`",
                quoted(duration)
            ));
        }
    };

    let num_gpus = num_gpus.trim();
    let gpus = match num_gpus.parse::<u32>() {
        Ok(gpus) if gpus >= 1 => gpus,
        _ => return Err(format!("column `num_gpus`: expected an integer >= 1, got `{}`", quoted(num_gpus))),
    };

    let gpu_time = gpu_time.trim();
    let gpu_secs = match gpu_time.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => secs,
        _ => return Err(format!("column `gpu_time`: expected GPU-seconds, a number >= 0, got `{}`", quoted(gpu_time))),
    };
    let expected = duration_secs * f64::from(gpus);
    let tolerance = (expected * GPU_TIME_RELATIVE_TOLERANCE).max(GPU_TIME_ABSOLUTE_TOLERANCE);
    if (gpu_secs - expected).abs() > tolerance {
        return Err(format!(
            "column `gpu_time`: expected duration × num_gpus = {expected} (within 1%), got `{}`",
            quoted(gpu_time)
        ));
    }

    let tenant = cluster.trim();
    if tenant.is_empty() {
        return Err("column `cluster`: expected a tenant id, got an empty value".to_string());
    }

    // Bounded above, so the cast cannot saturate; sub-second jobs round up to 1 s.
    let duration_secs = (duration_secs.round() as u64).max(1);
    Ok((submit, RawJob { submit_secs: 0, duration_secs, gpus, tenant: tenant.to_string(), gpu_memory_gib: 0 }))
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) as seconds since 1970-01-01 00:00:00.
fn parse_timestamp(text: &str) -> Result<i64, String> {
    let malformed = || format!("column `timestamp`: expected `YYYY-MM-DD HH:MM:SS`, got `{}`", quoted(text));
    let Ok(bytes) = <[u8; 19]>::try_from(text.as_bytes()) else {
        return Err(malformed());
    };
    let [y0, y1, y2, y3, b'-', mo0, mo1, b'-', d0, d1, b' ', h0, h1, b':', mi0, mi1, b':', s0, s1] = bytes else {
        return Err(malformed());
    };
    let (Some(year), Some(month), Some(day), Some(hour), Some(minute), Some(second)) = (
        digits(&[y0, y1, y2, y3]),
        digits(&[mo0, mo1]),
        digits(&[d0, d1]),
        digits(&[h0, h1]),
        digits(&[mi0, mi1]),
        digits(&[s0, s1]),
    ) else {
        return Err(malformed());
    };

    let out_of_range =
        |what: &str, value: u32| format!("column `timestamp`: {what} {value} is out of range in `{}`", quoted(text));
    if !(1..=12).contains(&month) {
        return Err(out_of_range("month", month));
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err(out_of_range("day", day));
    }
    if hour > 23 {
        return Err(out_of_range("hour", hour));
    }
    if minute > 59 {
        return Err(out_of_range("minute", minute));
    }
    if second > 59 {
        return Err(out_of_range("second", second));
    }

    let days = days_from_civil(i64::from(year), month, day);
    Ok(days * 86_400 + i64::from(hour * 3_600 + minute * 60 + second))
}

/// The decimal value of ASCII digits, or `None` if any byte is not a digit.
fn digits(bytes: &[u8]) -> Option<u32> {
    bytes.iter().try_fold(0u32, |value, &byte| byte.is_ascii_digit().then(|| value * 10 + u32::from(byte - b'0')))
}

fn is_leap_year(year: u32) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

/// Days in `month` (1–12) of `year` in the proleptic Gregorian calendar.
fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        2 if is_leap_year(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to the given date (proleptic Gregorian; negative before 1970).
///
/// Counting years from March makes the leap day the last day of the counted year, so the day of
/// the year follows from the month by one linear formula, and whole 400-year cycles (146,097 days)
/// make the count exact for any year.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    // March is month 0 of the shifted year; (153 m + 2) / 5 is the days before month m.
    let shifted_month = i64::from((month + 9) % 12);
    let day_of_year = (153 * shifted_month + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    // 719,468 days separate 0000-03-01 from 1970-01-01.
    era * 146_097 + day_of_era - 719_468
}

/// `value`, cut to [`MAX_QUOTED_CHARS`] characters for an error message.
fn quoted(value: &str) -> String {
    match value.char_indices().nth(MAX_QUOTED_CHARS) {
        Some((cut, _)) => format!("{}…", value.get(..cut).unwrap_or(value)),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    const GOOD: &str = "timestamp,duration,num_gpus,gpu_time,cluster\n\
        2017-10-09 07:01:55,66.4,1,66.4,11cb48\n\
        2017-10-09 06:13:03,2951.0,4,11804.0,6214e9\r\n\
        \n\
        2017-10-09 07:01:55,0.2,2,0.4,6c71a0\n";

    fn parse(text: &str) -> Result<Vec<RawJob>, SimError> {
        parse_philly(text, Path::new("trace.csv"))
    }

    /// Parses a file made of the header and `row`, expecting a trace error; returns its line and
    /// message.
    fn bad_row(row: &str) -> (usize, String) {
        let text = format!("{HEADER}\n2017-10-09 07:01:55,66.0,1,66.0,ok\n{row}\n");
        match parse(&text) {
            Err(SimError::Trace { path, line, message }) => {
                assert_eq!(path, PathBuf::from("trace.csv"));
                (line, message)
            }
            other => panic!("expected a trace error for `{row}`, got {other:?}"),
        }
    }

    #[test]
    fn rows_are_sorted_rebased_and_rounded() {
        let jobs = parse(GOOD).unwrap();
        let job = |submit_secs, duration_secs, gpus, tenant: &str| RawJob {
            submit_secs,
            duration_secs,
            gpus,
            tenant: tenant.to_string(),
            gpu_memory_gib: 0,
        };
        assert_eq!(jobs, vec![job(0, 2951, 4, "6214e9"), job(2932, 66, 1, "11cb48"), job(2932, 1, 2, "6c71a0")]);
    }

    #[test]
    fn timestamps_count_seconds_since_1970_in_utc() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Ok(0));
        assert_eq!(parse_timestamp("1969-12-31 00:00:00"), Ok(-86_400));
        assert_eq!(parse_timestamp("2000-02-29 23:59:59"), Ok(951_868_799));
        assert_eq!(parse_timestamp("2017-10-09 07:01:55"), Ok(1_507_532_515));
    }

    #[test]
    fn a_wrong_header_is_an_error_on_line_one() {
        let err = parse("time,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,1,66.0,a\n").unwrap_err();
        let SimError::Trace { line, message, .. } = err else { panic!("{err:?}") };
        assert_eq!(line, 1);
        assert!(message.contains(HEADER), "{message}");
        assert!(matches!(parse(""), Err(SimError::Trace { line: 1, .. })));
    }

    #[test]
    fn a_header_without_rows_has_no_jobs() {
        for text in [HEADER, "timestamp,duration,num_gpus,gpu_time,cluster\r\n\n\n"] {
            let err = parse(text).unwrap_err();
            assert!(err.to_string().contains("no jobs"), "{err}");
        }
    }

    #[test]
    fn malformed_rows_name_the_line_and_the_column() {
        let cases = [
            ("2017-10-09 07:01:55,66.0,1,66.0", "5 columns"),
            ("2017-10-09 07:01:55,66.0,1,66.0,a,b", "found 6"),
            ("2017-13-09 07:01:55,66.0,1,66.0,a", "`timestamp`: month 13"),
            ("2017-02-29 07:01:55,66.0,1,66.0,a", "`timestamp`: day 29"),
            ("2017-10-09 24:01:55,66.0,1,66.0,a", "`timestamp`: hour 24"),
            ("2017-10-09T07:01:55,66.0,1,66.0,a", "`timestamp`: expected `YYYY-MM-DD HH:MM:SS`"),
            ("2017-1x-09 07:01:55,66.0,1,66.0,a", "`timestamp`"),
            ("2017-10-09 07:01:55,-5,1,-5,a", "`duration`"),
            ("2017-10-09 07:01:55,nan,1,0,a", "got `nan`"),
            ("2017-10-09 07:01:55,abc,1,66.0,a", "`duration`"),
            ("2017-10-09 07:01:55,0,1,0,a", "`duration`"),
            ("2017-10-09 07:01:55,inf,1,0,a", "`duration`"),
            ("2017-10-09 07:01:55,66.0,0,0,a", "column `num_gpus`: expected an integer >= 1, got `0`"),
            ("2017-10-09 07:01:55,66.0,1.5,99.0,a", "`num_gpus`"),
            ("2017-10-09 07:01:55,66.0,-2,66.0,a", "`num_gpus`"),
            ("2017-10-09 07:01:55,66.0,1,-1,a", "`gpu_time`"),
            ("2017-10-09 07:01:55,66.0,2,66.0,a", "`gpu_time`: expected duration × num_gpus = 132"),
            ("2017-10-09 07:01:55,66.0,1,66.0,", "`cluster`"),
            ("2017-10-09 07:01:55,66.0,1,66.0,  ", "`cluster`"),
        ];
        for (row, expected) in cases {
            let (line, message) = bad_row(row);
            assert_eq!(line, 3, "{row}");
            assert!(message.contains(expected), "`{row}`: `{message}` lacks `{expected}`");
        }
    }

    #[test]
    fn gpu_time_within_one_percent_is_accepted() {
        let text = format!("{HEADER}\n2017-10-09 07:01:55,1000.0,2,2015.0,a\n2017-10-09 07:01:55,10,1,10.9,a\n");
        assert_eq!(parse(&text).unwrap().len(), 2);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        let (_, message) = bad_row(&format!("2017-10-09 07:01:55,{},1,1,a", "9".repeat(500)));
        assert!(message.len() < 200, "{message}");
    }

    #[test]
    fn an_unreadable_file_is_an_io_error() {
        let err = read_philly(Path::new("/nonexistent/philly.csv")).unwrap_err();
        assert!(matches!(err, SimError::Io { .. }), "{err:?}");
    }

    #[test]
    fn the_real_philly_trace_parses() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/philly.csv"));
        if !path.exists() {
            println!("skipped: {} is not present", path.display());
            return;
        }
        let jobs = read_philly(path).unwrap();
        assert_eq!(jobs.len(), 82_247);
        let tenants: std::collections::BTreeSet<&str> = jobs.iter().map(|j| j.tenant.as_str()).collect();
        assert_eq!(tenants.len(), 15);
        assert_eq!(jobs.iter().map(|j| j.gpus).max(), Some(128));
        assert_eq!(jobs.first().map(|j| j.submit_secs), Some(0));
        assert!(jobs.windows(2).all(|w| w[0].submit_secs <= w[1].submit_secs));
    }
}
