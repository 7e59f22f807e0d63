//! Bandwidth and egress price between regions, so placement can weigh moving data against waiting.
//!
//! The table lives in the gateway config as a list of `{from, to, gbps, usdPerGb}`. A pair that is
//! listed in one direction only is used for both (lookup is symmetric); a pair listed in both
//! directions keeps both, because egress is priced by the sending region and is often asymmetric.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why a network table from the config was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NetworkError {
    /// Bandwidth must be a positive, finite number of Gbit/s, or every transfer would take forever.
    #[error("network link {from} -> {to}: gbps must be a positive number, got {gbps}")]
    InvalidBandwidth {
        /// Sending region.
        from: String,
        /// Receiving region.
        to: String,
        /// The value given.
        gbps: f64,
    },
    /// Egress price must be zero or more and finite.
    #[error("network link {from} -> {to}: usdPerGb must be zero or a positive number, got {usd_per_gb}")]
    InvalidPrice {
        /// Sending region.
        from: String,
        /// Receiving region.
        to: String,
        /// The value given.
        usd_per_gb: f64,
    },
}

/// Throughput and price of moving data over one link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkCost {
    /// Sustained bulk throughput in Gbit/s.
    pub gbps: f64,
    /// Egress price in US$ per GB (10^9 bytes).
    pub usd_per_gb: f64,
}

/// Bytes in a GiB over bytes in a GB: dataset sizes are in GiB, prices and link speeds per GB.
const GB_PER_GIB: f64 = 1.073_741_824;

/// What copying a dataset to another region takes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct DataCopy {
    /// GB (10^9 bytes) moved.
    pub gb: f64,
    /// Seconds at the link's bandwidth (infinite over a link of no bandwidth).
    pub secs: f64,
    /// US$ of egress.
    pub usd: f64,
}

/// One configured link, as written in the gateway config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkLink {
    /// Region the data leaves (pays the egress).
    pub from: String,
    /// Region the data arrives in.
    pub to: String,
    /// Sustained bulk throughput in Gbit/s.
    pub gbps: f64,
    /// Egress price in US$ per GB.
    pub usd_per_gb: f64,
}

/// Region-to-region link costs, with defaults for the same region and for pairs nobody listed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "Vec<NetworkLink>", into = "Vec<NetworkLink>")]
pub struct NetworkTable {
    // Nested maps so a lookup borrows `&str` keys instead of building a `(String, String)`.
    links: BTreeMap<String, BTreeMap<String, LinkCost>>,
}

impl NetworkTable {
    /// Data that stays in its region: a fast local fabric and no egress charge. A `from == to`
    /// entry overrides it for one region.
    pub const SAME_REGION: LinkCost = LinkCost { gbps: 25.0, usd_per_gb: 0.0 };

    /// A pair nobody configured: assume a slow internet path at the usual internet egress price,
    /// so unknown moves look expensive rather than free.
    pub const UNKNOWN_PAIR: LinkCost = LinkCost { gbps: 1.0, usd_per_gb: 0.09 };

    /// An empty table: every pair uses [`Self::SAME_REGION`] or [`Self::UNKNOWN_PAIR`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces the `from -> to` link.
    pub fn insert(&mut self, from: &str, to: &str, cost: LinkCost) -> Result<(), NetworkError> {
        if !(cost.gbps.is_finite() && cost.gbps > 0.0) {
            return Err(NetworkError::InvalidBandwidth { from: from.to_owned(), to: to.to_owned(), gbps: cost.gbps });
        }
        if !(cost.usd_per_gb.is_finite() && cost.usd_per_gb >= 0.0) {
            return Err(NetworkError::InvalidPrice {
                from: from.to_owned(),
                to: to.to_owned(),
                usd_per_gb: cost.usd_per_gb,
            });
        }
        self.links.entry(from.to_owned()).or_default().insert(to.to_owned(), cost);
        Ok(())
    }

    /// Cost of moving data from `from` to `to`: the listed link, else the reverse direction,
    /// else [`Self::SAME_REGION`] or [`Self::UNKNOWN_PAIR`].
    pub fn link(&self, from: &str, to: &str) -> LinkCost {
        let listed = |a: &str, b: &str| self.links.get(a).and_then(|m| m.get(b)).copied();
        listed(from, to).or_else(|| listed(to, from)).unwrap_or(if from == to {
            Self::SAME_REGION
        } else {
            Self::UNKNOWN_PAIR
        })
    }

    /// Transfer throughput from `from` to `to` in Gbit/s (see [`Self::link`]).
    pub fn gbps(&self, from: &str, to: &str) -> f64 {
        self.link(from, to).gbps
    }

    /// Egress price from `from` to `to` in US$ per GB (see [`Self::link`]).
    pub fn usd_per_gb(&self, from: &str, to: &str) -> f64 {
        self.link(from, to).usd_per_gb
    }

    /// Adds or replaces every link of `overrides`, e.g. a config's links over
    /// [`Self::default_seeded`].
    pub fn extend(&mut self, overrides: &NetworkTable) {
        for (from, tos) in &overrides.links {
            let entry = self.links.entry(from.clone()).or_default();
            for (to, cost) in tos {
                entry.insert(to.clone(), *cost);
            }
        }
    }

    /// Every configured link, sorted by `from` then `to`.
    pub fn links(&self) -> impl Iterator<Item = NetworkLink> + '_ {
        self.links.iter().flat_map(|(from, tos)| {
            tos.iter().map(move |(to, cost)| NetworkLink {
                from: from.clone(),
                to: to.clone(),
                gbps: cost.gbps,
                usd_per_gb: cost.usd_per_gb,
            })
        })
    }

    /// What copying `size_gib` GiB of data from region `from` to region `to` takes; nothing
    /// when both are the same region (the data is already there).
    pub fn copy(&self, from: &str, to: &str, size_gib: f64) -> DataCopy {
        if from == to {
            return DataCopy::default();
        }
        let link = self.link(from, to);
        let gb = size_gib * GB_PER_GIB;
        // Links are validated positive; the guard keeps a hand-built table from dividing by 0.
        let secs = if link.gbps > 0.0 { gb * 8.0 / link.gbps } else { f64::INFINITY };
        DataCopy { gb, secs, usd: gb * link.usd_per_gb }
    }

    /// A table for the regions `us-east`, `us-west`, `eu-west`, `eu-central` and `ap-northeast`.
    ///
    /// Numbers are picked from public measurements between the matching AWS regions (Skyplane's
    /// grids, Jan 2022: median bulk throughput of one 32-vCPU VM pair, and list egress prices):
    /// about 3–4.7 Gbit/s between regions, US$0.02/GB leaving the US and EU regions and
    /// US$0.09/GB leaving Tokyo. Operators should replace them with their own.
    pub fn default_seeded() -> Self {
        // (from, to, Gbit/s, US$/GB); one direction each, except Tokyo's pricier egress.
        const SEED: &[(&str, &str, f64, f64)] = &[
            ("us-east", "us-west", 4.35, 0.02),
            ("us-east", "eu-west", 4.32, 0.02),
            ("us-east", "eu-central", 4.12, 0.02),
            ("us-east", "ap-northeast", 3.65, 0.02),
            ("us-west", "eu-west", 3.86, 0.02),
            ("us-west", "eu-central", 3.66, 0.02),
            ("us-west", "ap-northeast", 4.07, 0.02),
            ("eu-west", "eu-central", 4.66, 0.02),
            ("eu-west", "ap-northeast", 3.13, 0.02),
            ("eu-central", "ap-northeast", 2.88, 0.02),
            ("ap-northeast", "us-east", 3.65, 0.09),
            ("ap-northeast", "us-west", 4.07, 0.09),
            ("ap-northeast", "eu-west", 3.13, 0.09),
            ("ap-northeast", "eu-central", 2.88, 0.09),
        ];
        let mut links: BTreeMap<String, BTreeMap<String, LinkCost>> = BTreeMap::new();
        for &(from, to, gbps, usd_per_gb) in SEED {
            // Built directly: the constants above are valid, so `insert`'s checks cannot fail.
            links.entry(from.to_owned()).or_default().insert(to.to_owned(), LinkCost { gbps, usd_per_gb });
        }
        Self { links }
    }
}

impl TryFrom<Vec<NetworkLink>> for NetworkTable {
    type Error = NetworkError;

    fn try_from(list: Vec<NetworkLink>) -> Result<Self, Self::Error> {
        let mut table = Self::new();
        for link in list {
            table.insert(&link.from, &link.to, LinkCost { gbps: link.gbps, usd_per_gb: link.usd_per_gb })?;
        }
        Ok(table)
    }
}

impl From<NetworkTable> for Vec<NetworkLink> {
    fn from(table: NetworkTable) -> Self {
        table.links().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copying_costs_time_and_egress_between_regions_and_nothing_within_one() {
        let table = NetworkTable::default_seeded();
        assert_eq!(table.copy("us-east", "us-east", 500.0), DataCopy::default());
        let copy = table.copy("us-east", "us-west", 100.0);
        assert!((copy.gb - 107.374_182_4).abs() < 1e-9);
        assert!((copy.secs - copy.gb * 8.0 / 4.35).abs() < 1e-9);
        assert!((copy.usd - copy.gb * 0.02).abs() < 1e-9);
    }

    #[test]
    fn lookup_is_symmetric_when_one_direction_is_listed() {
        let table = NetworkTable::default_seeded();
        assert_eq!(table.link("us-west", "us-east"), table.link("us-east", "us-west"));
        assert_eq!(table.link("us-east", "us-west").gbps, 4.35);
    }

    #[test]
    fn both_directions_keep_their_own_egress_price() {
        let table = NetworkTable::default_seeded();
        assert_eq!(table.link("us-east", "ap-northeast").usd_per_gb, 0.02);
        assert_eq!(table.link("ap-northeast", "us-east").usd_per_gb, 0.09);
    }

    #[test]
    fn same_region_and_unknown_pairs_use_defaults() {
        let table = NetworkTable::default_seeded();
        assert_eq!(table.link("eu-west", "eu-west"), NetworkTable::SAME_REGION);
        assert_eq!(table.link("eu-west", "mars-1"), NetworkTable::UNKNOWN_PAIR);
    }

    #[test]
    fn overrides_replace_seeded_links() {
        let mut table = NetworkTable::default_seeded();
        let mut overrides = NetworkTable::new();
        overrides.insert("us-west", "us-east", LinkCost { gbps: 100.0, usd_per_gb: 0.0 }).unwrap();
        table.extend(&overrides);
        assert_eq!(table.gbps("us-west", "us-east"), 100.0);
        assert_eq!(table.usd_per_gb("us-west", "us-east"), 0.0);
        // The seeded reverse entry stays for the other direction.
        assert_eq!(table.gbps("us-east", "us-west"), 4.35);
    }

    #[test]
    fn config_list_round_trips_and_rejects_zero_bandwidth() {
        let table = NetworkTable::default_seeded();
        let json = serde_json::to_string(&table).unwrap();
        assert!(json.starts_with("[{\"from\":"), "{json}");
        assert!(json.contains("\"usdPerGb\""));
        let back: NetworkTable = serde_json::from_str(&json).unwrap();
        assert_eq!(back, table);

        let bad = r#"[{"from":"a","to":"b","gbps":0,"usdPerGb":0.02}]"#;
        let err = serde_json::from_str::<NetworkTable>(bad).unwrap_err().to_string();
        assert!(err.contains("a -> b: gbps must be a positive number"), "{err}");
    }
}
