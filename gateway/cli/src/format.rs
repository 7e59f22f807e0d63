//! Human-readable numbers for terminal output: durations, ages and prices.

/// A duration in seconds as its two largest units: `45s`, `3m12s`, `12m`, `3h05m`, `2d03h`.
/// A zero second unit is left out (`12m`, `3h`); under half a second but above zero reads `<1s`;
/// negative reads `0s`; not-a-number reads `-`.
pub fn duration(secs: f64) -> String {
    if secs.is_nan() {
        return "-".to_owned();
    }
    if secs > 0.0 && secs < 0.5 {
        return "<1s".to_owned();
    }
    // `as` saturates, so infinities and huge values stay printable.
    let total = secs.max(0.0).round() as u64;
    let (major, minor, major_unit, minor_unit) = match total {
        0..60 => return format!("{total}s"),
        60..3_600 => (total / 60, total % 60, "m", "s"),
        3_600..86_400 => (total / 3_600, total % 3_600 / 60, "h", "m"),
        _ => (total / 86_400, total % 86_400 / 3_600, "d", "h"),
    };
    if minor == 0 { format!("{major}{major_unit}") } else { format!("{major}{major_unit}{minor:02}{minor_unit}") }
}

/// How long ago `then_ms` was at `now_ms` (both milliseconds since the Unix epoch), as
/// [`duration`]; a time in the future reads `0s`.
pub fn age(now_ms: i64, then_ms: i64) -> String {
    duration(now_ms.saturating_sub(then_ms).max(0) as f64 / 1000.0)
}

/// US dollars with cents, without the sign: `41.20`.
pub fn usd(amount: f64) -> String {
    format!("{amount:.2}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_use_their_two_largest_units() {
        assert_eq!(duration(0.0), "0s");
        assert_eq!(duration(0.2), "<1s");
        assert_eq!(duration(45.0), "45s");
        assert_eq!(duration(59.6), "1m");
        assert_eq!(duration(192.0), "3m12s");
        assert_eq!(duration(720.0), "12m");
        assert_eq!(duration(3.0 * 3600.0 + 5.0 * 60.0 + 59.0), "3h05m");
        assert_eq!(duration(7200.0), "2h");
        assert_eq!(duration(2.0 * 86_400.0 + 3.0 * 3600.0), "2d03h");
    }

    #[test]
    fn odd_durations_stay_printable() {
        assert_eq!(duration(-5.0), "0s");
        assert_eq!(duration(f64::NAN), "-");
        assert!(duration(f64::INFINITY).ends_with('h') || duration(f64::INFINITY).ends_with('d'));
    }

    #[test]
    fn ages_count_back_from_now() {
        assert_eq!(age(1_764_000_192_000, 1_764_000_000_000), "3m12s");
        assert_eq!(age(1_000, 5_000), "0s");
        assert_eq!(usd(41.2), "41.20");
    }
}
