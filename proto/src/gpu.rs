//! The GPU types Meridian knows, so a typo such as `h10` is caught at submit time.
//!
//! Besides whole GPUs, the catalog knows GPU slices (NVIDIA MIG instances): a known base type, a
//! dot, and a MIG profile, as in `a100-80g.1g.10gb` (one compute slice, 10 GiB) or
//! `h100.3g.40gb`. A slice type is a GPU type of its own: its memory is the profile's, a job that
//! names it matches only that slice type, and a job naming the base type (or no type at all)
//! never lands on slices.

/// One known GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuModel {
    /// The name used in specs and inventories (`h100`, `a100-80g`).
    pub name: &'static str,
    /// Memory per GPU in GiB.
    pub memory_gib: u32,
}

/// GPU models known without any configuration. Gateways may add more in their config.
pub const KNOWN_GPUS: &[GpuModel] = &[
    GpuModel { name: "b200", memory_gib: 180 },
    GpuModel { name: "h200", memory_gib: 141 },
    GpuModel { name: "h100", memory_gib: 80 },
    GpuModel { name: "gh200", memory_gib: 96 },
    GpuModel { name: "a100-80g", memory_gib: 80 },
    GpuModel { name: "a100-40g", memory_gib: 40 },
    GpuModel { name: "l40s", memory_gib: 48 },
    GpuModel { name: "l4", memory_gib: 24 },
    GpuModel { name: "a10g", memory_gib: 24 },
    GpuModel { name: "v100", memory_gib: 32 },
    GpuModel { name: "t4", memory_gib: 16 },
    GpuModel { name: "mi300x", memory_gib: 192 },
    GpuModel { name: "mi250x", memory_gib: 128 },
];

/// Most compute slices one MIG profile may have (a whole A100/H100 has 7).
pub const MAX_SLICE_COMPUTE: u32 = 7;

/// A GPU slice type (`a100-80g.3g.40gb`) split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSlice<'a> {
    /// The whole GPU's type (`a100-80g`).
    pub base: &'a str,
    /// Compute slices of the profile (`3` in `3g`), 1 to [`MAX_SLICE_COMPUTE`].
    pub compute: u32,
    /// Memory of the slice in GiB (`40` in `40gb`).
    pub memory_gib: u32,
}

impl<'a> GpuSlice<'a> {
    /// Reads `<base>.<N>g.<M>gb`; None when `name` does not have that form (a whole GPU's
    /// type). Says nothing about whether the base type is known: see [`GpuCatalog`].
    pub fn parse(name: &'a str) -> Option<Self> {
        let mut parts = name.rsplitn(3, '.');
        let (memory, compute, base) = (parts.next()?, parts.next()?, parts.next()?);
        let number = |text: &str| {
            (!text.is_empty() && text.chars().all(|c| c.is_ascii_digit())).then(|| text.parse::<u32>().ok()).flatten()
        };
        let compute = number(compute.strip_suffix('g')?)?;
        let memory_gib = number(memory.strip_suffix("gb")?)?;
        let valid = !base.is_empty() && (1..=MAX_SLICE_COMPUTE).contains(&compute) && memory_gib > 0;
        valid.then_some(Self { base, compute, memory_gib })
    }
}

/// Whether `gpu_type` names a GPU slice (`a100-80g.1g.10gb`) rather than a whole GPU. Purely
/// by its form, so code without a catalog (placement, the builtin scheduler) can tell; a job
/// that lists no `gpuTypes` accepts whole GPUs only.
pub fn is_slice(gpu_type: &str) -> bool {
    GpuSlice::parse(gpu_type).is_some()
}

/// Joins the GPU types of a *span* in the GPU type placement chose for a gang: a gang that
/// accepts several types may spread over types of equal speed on one cluster (A100 40 GB and
/// 80 GB nodes), and the chosen type then reads `a100-40g+a100-80g`. No type name contains it.
pub const SPAN_SEPARATOR: char = '+';

/// The GPU types of a type placement chose: one for a plain type, several for a span
/// (see [`SPAN_SEPARATOR`]).
pub fn span_types(chosen: &str) -> impl Iterator<Item = &str> {
    chosen.split(SPAN_SEPARATOR).filter(|t| !t.is_empty())
}

/// The types a member is told a gang may use when placement chose `chosen`: the spec's
/// `gpuTypes` as the offer pins it.
pub fn pinned_types(chosen: &str) -> Vec<String> {
    span_types(chosen).map(str::to_owned).collect()
}

/// The GPU types a gateway accepts: the built-in list plus configured extras.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCatalog {
    models: Vec<(String, u32)>,
}

impl Default for GpuCatalog {
    fn default() -> Self {
        Self { models: KNOWN_GPUS.iter().map(|m| (m.name.to_string(), m.memory_gib)).collect() }
    }
}

impl GpuCatalog {
    /// The built-in models plus `extra` (name, memory GiB); an extra with a known name replaces it.
    pub fn with_extra(extra: impl IntoIterator<Item = (String, u32)>) -> Self {
        let mut catalog = Self::default();
        for (name, memory) in extra {
            match catalog.models.iter_mut().find(|(n, _)| *n == name) {
                Some(entry) => entry.1 = memory,
                None => catalog.models.push((name, memory)),
            }
        }
        catalog
    }

    /// Memory per GPU of a known type. A slice type (`a100-80g.1g.10gb`) is known when its base
    /// type is and the profile's memory is at most the base's; its memory is the profile's.
    pub fn memory_gib(&self, name: &str) -> Option<u32> {
        let whole = |name: &str| self.models.iter().find(|(n, _)| n == name).map(|(_, m)| *m);
        whole(name).or_else(|| {
            let slice = GpuSlice::parse(name)?;
            (slice.memory_gib <= whole(slice.base)?).then_some(slice.memory_gib)
        })
    }

    /// Whether `name` is a known GPU type.
    pub fn contains(&self, name: &str) -> bool {
        self.memory_gib(name).is_some()
    }

    /// Known whole-GPU names, for error messages (slices of them are known too, see
    /// [`memory_gib`](Self::memory_gib)).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.models.iter().map(|(n, _)| n.as_str())
    }

    /// Why `name` is not a known type, for messages: a slice whose base is unknown or whose
    /// profile is too big, or an unknown name, with the known names and the slice form.
    pub fn unknown_reason(&self, name: &str) -> String {
        let known = self.names().collect::<Vec<_>>().join(", ");
        match GpuSlice::parse(name) {
            Some(slice) => match self.memory_gib(slice.base) {
                None => format!("unknown GPU type `{}` in slice type `{name}`; known types: {known}", slice.base),
                Some(memory) => format!(
                    "slice type `{name}` has {} GiB but a whole `{}` has only {memory} GiB",
                    slice.memory_gib, slice.base
                ),
            },
            None => {
                format!("unknown GPU type `{name}`; known types: {known}, or a slice of one such as `a100-80g.1g.10gb`")
            }
        }
    }

    /// The largest memory of any known GPU.
    pub fn max_memory_gib(&self) -> u32 {
        self.models.iter().map(|(_, m)| *m).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_names_its_types_and_a_plain_type_names_itself() {
        assert_eq!(pinned_types("a100-40g+a100-80g"), vec!["a100-40g".to_string(), "a100-80g".to_string()]);
        assert_eq!(pinned_types("h100"), vec!["h100".to_string()]);
        assert!(pinned_types("").is_empty());
        assert!(KNOWN_GPUS.iter().all(|g| !g.name.contains(SPAN_SEPARATOR)));
    }

    #[test]
    fn slice_types_take_their_memory_from_the_profile() {
        let catalog = GpuCatalog::default();
        assert_eq!(catalog.memory_gib("a100-80g.1g.10gb"), Some(10));
        assert_eq!(catalog.memory_gib("a100-80g.3g.40gb"), Some(40));
        assert_eq!(catalog.memory_gib("h100.7g.80gb"), Some(80));
        assert!(catalog.contains("a100-40g.1g.5gb"));
        assert_eq!(catalog.memory_gib("a100-80g"), Some(80), "whole GPUs are unchanged");
    }

    #[test]
    fn bad_slice_types_are_unknown_with_a_reason() {
        let catalog = GpuCatalog::default();
        for bad in
            ["a100-80g.1g", "a100-80g.0g.10gb", "a100-80g.8g.10gb", "a100-80g.1g.0gb", "a100-80g.1g.10", ".1g.10gb"]
        {
            assert!(!catalog.contains(bad), "{bad}");
        }
        assert!(!catalog.contains("a100-40g.7g.80gb"));
        assert!(catalog.unknown_reason("a100-40g.7g.80gb").contains("only 40 GiB"));
        assert!(catalog.unknown_reason("x100.1g.10gb").contains("unknown GPU type `x100`"));
        assert!(catalog.unknown_reason("h10").contains("a100-80g.1g.10gb"));
    }

    #[test]
    fn slices_are_told_apart_from_whole_gpus_by_form() {
        assert!(is_slice("a100-80g.1g.10gb"));
        assert!(!is_slice("a100-80g"));
        assert!(!is_slice("h100"));
        assert_eq!(
            GpuSlice::parse("a100-80g.2g.20gb"),
            Some(GpuSlice { base: "a100-80g", compute: 2, memory_gib: 20 })
        );
    }

    #[test]
    fn extras_may_be_sliced_too() {
        let catalog = GpuCatalog::with_extra([("rtx-pro".to_string(), 96)]);
        assert_eq!(catalog.memory_gib("rtx-pro.1g.24gb"), Some(24));
    }
}
