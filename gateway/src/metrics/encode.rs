//! Small helpers over `prometheus-client`'s encoder for collectors computed at scrape time: one
//! family at a time, labels as `(name, value)` pairs, label values made safe for the text format.

use std::borrow::Cow;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Result of encoding (the text encoder writes to a `String`).
pub type Result = std::result::Result<(), std::fmt::Error>;

/// A label value safe inside the text format's quotes: `prometheus-client` writes values as
/// given, so a quote, backslash or line break in a name (which validation should already keep
/// out) is replaced rather than allowed to break the exposition.
pub fn safe(value: &str) -> Cow<'_, str> {
    if value.chars().any(|c| matches!(c, '"' | '\\' | '\n' | '\r')) {
        Cow::Owned(value.chars().map(|c| if matches!(c, '"' | '\\' | '\n' | '\r') { '_' } else { c }).collect())
    } else {
        Cow::Borrowed(value)
    }
}

/// Labels of one series.
pub type Labels<'a> = Vec<(&'static str, Cow<'a, str>)>;

/// Encodes a gauge family: `name` with one sample per `(labels, value)`.
pub fn gauges<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    let series: Vec<_> = series.into_iter().collect();
    // A family of one series without labels is written without `{}`.
    if let [(labels, value)] = series.as_slice()
        && labels.is_empty()
    {
        return ConstGauge::new(*value).encode(family);
    }
    for (labels, value) in series {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Encodes a counter family: `name` (the text format adds `_total` to each sample).
pub fn counters<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels<'a>, f64)>,
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    let series: Vec<_> = series.into_iter().collect();
    if let [(labels, value)] = series.as_slice()
        && labels.is_empty()
    {
        return ConstCounter::new(*value).encode(family);
    }
    for (labels, value) in series {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One histogram series: labels, non-cumulative `(upper bound, count)` buckets ending with
/// `f64::MAX`, sum and count.
pub struct HistogramSeries<'a> {
    /// The series' labels.
    pub labels: Labels<'a>,
    /// `(upper bound, count)` per bucket.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl<'a> HistogramSeries<'a> {
    /// A series from one of the core's histograms.
    pub fn of(labels: Labels<'a>, histogram: &meridian_core::tally::Histogram) -> Self {
        Self { labels, buckets: histogram.buckets(), sum: histogram.sum(), count: histogram.count() }
    }
}

/// Encodes a histogram family.
pub fn histograms<'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = HistogramSeries<'a>>,
) -> Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    let series: Vec<_> = series.into_iter().collect();
    if let [one] = series.as_slice()
        && one.labels.is_empty()
    {
        return family.encode_histogram::<NoLabelSet>(one.sum, one.count, &one.buckets, None);
    }
    for one in series {
        family.encode_family(&one.labels)?.encode_histogram::<NoLabelSet>(one.sum, one.count, &one.buckets, None)?;
    }
    Ok(())
}

/// 1.0 for true, 0.0 for false.
pub fn flag(value: bool) -> f64 {
    if value { 1.0 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_cannot_break_out_of_their_quotes() {
        assert_eq!(safe("east-1"), "east-1");
        assert_eq!(safe("a\"b\\c\nd"), "a_b_c_d");
    }
}
