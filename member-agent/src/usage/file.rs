//! A file of per-GPU utilisation, read at every sample: how a site without NVML on the agent's
//! host (DCGM exporter, a node exporter textfile, a script) feeds the agent.
//!
//! Two formats, told apart by the first non-blank character:
//!
//! - JSON (`{`): `{"gpus": [{"node": "n0", "gpu": "0", "utilization": 0.02}]}`, utilisation as a
//!   fraction 0..=1; `node` may be left out.
//! - Prometheus text: `DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="n0"} 2` (percent, as DCGM
//!   writes it) or `meridian_gpu_utilization_ratio{node="n0",gpu="0"} 0.02` (fraction). The node
//!   is the `node` label, else `Hostname`; other metrics and comments are skipped.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{GpuSample, Result, UsageError, UtilizationSource};

/// DCGM's GPU utilisation metric, in percent.
const DCGM_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Meridian's own name for a fraction.
const RATIO: &str = "meridian_gpu_utilization_ratio";

/// [`UtilizationSource`] over a file.
#[derive(Debug, Clone)]
pub struct FileUtilization {
    path: PathBuf,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonFile {
    gpus: Vec<JsonGpu>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonGpu {
    #[serde(default)]
    node: String,
    gpu: serde_json::Value,
    utilization: f64,
}

impl FileUtilization {
    /// A source reading `path` at every sample.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

impl UtilizationSource for FileUtilization {
    fn sample(&self) -> Result<Vec<GpuSample>> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|source| UsageError::Read { path: self.path.clone(), source })?;
        parse(&text, &self.path)
    }
}

/// The samples in `text` (`path` is for messages).
pub fn parse(text: &str, path: &Path) -> Result<Vec<GpuSample>> {
    let error = |line: usize, reason: String| UsageError::Parse { path: path.to_path_buf(), line, reason };
    if text.trim_start().starts_with('{') {
        let file: JsonFile = serde_json::from_str(text).map_err(|e| error(e.line().max(1), e.to_string()))?;
        return file
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, gpu)| {
                let id = match gpu.gpu {
                    serde_json::Value::String(id) => id,
                    serde_json::Value::Number(n) => n.to_string(),
                    other => return Err(error(1, format!("gpus[{i}].gpu: {other} must be a device index or id"))),
                };
                let utilization = fraction(gpu.utilization).ok_or_else(|| {
                    error(1, format!("gpus[{i}].utilization: {} must be from 0 to 1", gpu.utilization))
                })?;
                Ok(GpuSample { node: gpu.node, gpu: id, utilization })
            })
            .collect();
    }
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        let name = line.split(|c: char| c == '{' || c.is_whitespace()).next().unwrap_or_default();
        let scale = match name {
            DCGM_UTIL => 100.0,
            RATIO => 1.0,
            _ => continue,
        };
        let sample = exposition_line(line, scale).map_err(|reason| error(i + 1, reason))?;
        samples.push(sample);
    }
    Ok(samples)
}

/// `NAME{labels} VALUE [TIMESTAMP]`, the value divided by `scale`.
fn exposition_line(line: &str, scale: f64) -> Result<GpuSample, String> {
    let open = line.find('{').ok_or("expected labels `{gpu=\"…\"}` after the metric name")?;
    let close = line.rfind('}').filter(|&c| c > open).ok_or("labels are not closed with `}`")?;
    let labels = labels(&line[open + 1..close])?;
    let label = |name: &str| labels.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let gpu = label("gpu").ok_or("no `gpu` label")?;
    let node = label("node").or_else(|| label("Hostname")).unwrap_or_default();
    let value = line[close + 1..].split_whitespace().next().ok_or("no value after the labels")?;
    let value: f64 = value.parse().map_err(|_| format!("value `{value}` is not a number"))?;
    let utilization =
        fraction(value / scale).ok_or_else(|| format!("value {value} is outside 0..{scale} for GPU `{gpu}`"))?;
    Ok(GpuSample { node, gpu, utilization })
}

/// `a="x",b="y"` as pairs (with `\"` and `\\` unescaped).
fn labels(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let eq = rest.find('=').ok_or_else(|| format!("label `{rest}` has no `=`"))?;
        let key = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let mut chars = after.char_indices();
        if chars.next().map(|(_, c)| c) != Some('"') {
            return Err(format!("label `{key}`: value must be quoted"));
        }
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (at, c) in chars {
            if escaped {
                value.push(if c == 'n' { '\n' } else { c });
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                end = Some(at);
                break;
            } else {
                value.push(c);
            }
        }
        let end = end.ok_or_else(|| format!("label `{key}`: value is not closed with `\"`"))?;
        pairs.push((key, value));
        rest = after[end + 1..].trim_start().trim_start_matches(',').trim_start();
    }
    Ok(pairs)
}

/// `value` when it is a fraction 0..=1 (a hair above 1 from rounding counts as 1).
fn fraction(value: f64) -> Option<f64> {
    if value.is_finite() && (0.0..=1.0 + 1e-9).contains(&value) { Some(value.min(1.0)) } else { None }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sample(node: &str, gpu: &str, utilization: f64) -> GpuSample {
        GpuSample { node: node.into(), gpu: gpu.into(), utilization }
    }

    #[test]
    fn dcgm_text_is_read_in_percent_and_other_metrics_are_skipped() {
        let text = "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n\
                    # TYPE DCGM_FI_DEV_GPU_UTIL gauge\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\",Hostname=\"n0\",modelName=\"NVIDIA H100\"} 2\n\
                    DCGM_FI_DEV_FB_USED{gpu=\"0\",Hostname=\"n0\"} 4000\n\
                    DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",Hostname=\"n0\"} 90 1700000000000\n";
        let samples = parse(text, Path::new("dcgm.prom")).unwrap();
        assert_eq!(samples, vec![sample("n0", "0", 0.02), sample("n0", "1", 0.9)]);
    }

    #[test]
    fn meridian_ratio_lines_take_the_node_label() {
        let text =
            "meridian_gpu_utilization_ratio{node=\"a\",gpu=\"3\"} 0.5\nmeridian_gpu_utilization_ratio{gpu=\"1\"} 1\n";
        assert_eq!(parse(text, Path::new("f")).unwrap(), vec![sample("a", "3", 0.5), sample("", "1", 1.0)]);
    }

    #[test]
    fn json_takes_fractions_and_numeric_or_text_device_ids() {
        let text = r#"{"gpus": [{"node": "n0", "gpu": 0, "utilization": 0.25}, {"gpu": "MIG-x", "utilization": 0}]}"#;
        assert_eq!(parse(text, Path::new("f")).unwrap(), vec![sample("n0", "0", 0.25), sample("", "MIG-x", 0.0)]);
    }

    #[test]
    fn bad_values_name_the_file_line_and_gpu() {
        let err = parse("x 1\nDCGM_FI_DEV_GPU_UTIL{gpu=\"2\"} 250\n", Path::new("/run/gpu.prom")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/run/gpu.prom") && text.contains("line 2") && text.contains("`2`"), "{text}");
        let err = parse(r#"{"gpus": [{"gpu": 0, "utilization": 7}]}"#, Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("gpus[0].utilization"), "{err}");
        let err = parse("DCGM_FI_DEV_GPU_UTIL{Hostname=\"n\"} 3\n", Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("no `gpu` label"), "{err}");
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let err = FileUtilization::new("/nonexistent/gpu.prom").sample().unwrap_err();
        assert!(matches!(err, UsageError::Read { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/gpu.prom"), "{err}");
    }
}
