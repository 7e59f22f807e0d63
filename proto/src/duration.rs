//! Human durations such as `90s`, `30m`, `6h`, `1h30m` or `2d`, as used in job specs and configs.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a duration string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseDurationError {
    /// The text was empty.
    #[error("empty duration (write e.g. `30m`, `6h` or `1h30m`)")]
    Empty,
    /// A number had no unit after it, or the unit was not one of `ms`, `s`, `m`, `h`, `d`.
    #[error("`{0}` is not a duration: use a number followed by ms, s, m, h or d (e.g. `1h30m`)")]
    Malformed(String),
    /// The value does not fit in 64-bit seconds.
    #[error("`{0}` is too long a duration")]
    Overflow(String),
}

/// A span of time written the human way. Serializes as the shortest such text (`1h30m`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    /// A duration of whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// Whole seconds (milliseconds are dropped).
    pub const fn as_secs(&self) -> u64 {
        self.0.as_secs()
    }

    /// Seconds as a float, for cost and time estimates.
    pub fn as_secs_f64(&self) -> f64 {
        self.0.as_secs_f64()
    }
}

/// Parses `90s`, `30m`, `6h`, `1h30m`, `2d`, `250ms`. A bare number is rejected: the unit is
/// required so `30` is never silently read as seconds when minutes were meant.
pub fn parse_duration(text: &str) -> Result<Duration, ParseDurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ParseDurationError::Empty);
    }
    let malformed = || ParseDurationError::Malformed(text.to_string());
    let overflow = || ParseDurationError::Overflow(text.to_string());
    let bytes = text.as_bytes();
    let mut total_ms: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(malformed());
        }
        let number: u64 = text[start..i].parse().map_err(|_| overflow())?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit_ms: u64 = match &text[unit_start..i] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(malformed()),
        };
        let part = number.checked_mul(unit_ms).ok_or_else(overflow)?;
        total_ms = total_ms.checked_add(part).ok_or_else(overflow)?;
    }
    Ok(Duration::from_millis(total_ms))
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ms = self.0.as_millis();
        if ms == 0 {
            return f.write_str("0s");
        }
        for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
            if ms >= size {
                write!(f, "{}{unit}", ms / size)?;
                ms %= size;
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for HumanDuration {
    type Err = ParseDurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration(s).map(Self)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_compound_durations() {
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration(" 45s "), Ok(Duration::from_secs(45)));
    }

    #[test]
    fn rejects_bare_numbers_and_unknown_units() {
        assert!(matches!(parse_duration("30"), Err(ParseDurationError::Malformed(_))));
        assert!(matches!(parse_duration("3w"), Err(ParseDurationError::Malformed(_))));
        assert!(matches!(parse_duration("-1h"), Err(ParseDurationError::Malformed(_))));
        assert_eq!(parse_duration(""), Err(ParseDurationError::Empty));
        assert!(matches!(parse_duration("99999999999999999999h"), Err(ParseDurationError::Overflow(_))));
    }

    #[test]
    fn display_round_trips() {
        for text in ["1h30m", "6h", "45s", "1d2h3m4s", "0s", "1s500ms"] {
            let parsed: HumanDuration = text.parse().unwrap();
            assert_eq!(parsed.to_string(), text);
        }
    }
}
