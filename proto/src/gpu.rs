//! The GPU types Meridian knows, so a typo such as `h10` is caught at submit time.

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

    /// Memory per GPU of a known type.
    pub fn memory_gib(&self, name: &str) -> Option<u32> {
        self.models.iter().find(|(n, _)| n == name).map(|(_, m)| *m)
    }

    /// Whether `name` is a known GPU type.
    pub fn contains(&self, name: &str) -> bool {
        self.memory_gib(name).is_some()
    }

    /// Known names, for error messages.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.models.iter().map(|(n, _)| n.as_str())
    }

    /// The largest memory of any known GPU.
    pub fn max_memory_gib(&self) -> u32 {
        self.models.iter().map(|(_, m)| *m).max().unwrap_or(0)
    }
}
