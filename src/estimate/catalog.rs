//! The GPU catalogue (`profiles/gpus.toml`, embedded): what each card can
//! hold once the CUDA context is up, and which cards an estimate fits.

use serde::{Deserialize, Serialize};

use super::EstimateError;

const CATALOG: &str = include_str!("../../profiles/gpus.toml");

/// One card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub kind: String,
    /// Total as nvidia-smi reports it, MiB.
    pub memory_mib: u64,
    /// CUDA context and framework kernels, MiB.
    pub context_mib: u64,
}

impl Gpu {
    pub fn total(&self) -> u64 {
        self.memory_mib << 20
    }
    /// Bytes a run can use: total minus the context.
    pub fn usable(&self) -> u64 {
        (self.memory_mib.saturating_sub(self.context_mib)) << 20
    }
}

#[derive(Deserialize)]
struct File {
    gpu: Vec<Gpu>,
}

/// Every card, smallest first.
pub fn all() -> Vec<Gpu> {
    let mut gpus = toml::from_str::<File>(CATALOG)
        .map(|f| f.gpu)
        .unwrap_or_default();
    gpus.sort_by_key(|g| (g.memory_mib, g.name.clone()));
    gpus
}

fn key(s: &str) -> String {
    s.to_ascii_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .trim_start_matches("nvidia")
        .trim_start_matches("geforce")
        .to_string()
}

/// The card named `name` (or one of its aliases).
pub fn find(name: &str) -> Result<Gpu, EstimateError> {
    let want = key(name);
    let gpus = all();
    gpus.iter()
        .find(|g| key(&g.name) == want || g.aliases.iter().any(|a| key(a) == want))
        .cloned()
        .ok_or_else(|| {
            let names: Vec<String> = gpus.iter().map(|g| g.name.clone()).collect();
            EstimateError::Invalid(format!(
                "unknown GPU '{name}' (catalogue: {})",
                names.join(", ")
            ))
        })
}

/// The smallest card whose usable memory holds `bytes` with `headroom`
/// (0.0 = exactly, 0.2 = 20% to spare).
pub fn smallest_fitting(bytes: u64, headroom: f64) -> Option<Gpu> {
    all()
        .into_iter()
        .find(|g| bytes as f64 * (1.0 + headroom) <= g.usable() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalogue_spans_8_to_141_gb() {
        let gpus = all();
        assert!(gpus.len() >= 20);
        assert!(gpus.first().unwrap().memory_mib <= 8192);
        assert!(gpus.last().unwrap().memory_mib >= 141 * 1000);
        assert!(
            gpus.iter().any(|g| g.kind == "consumer")
                && gpus.iter().any(|g| g.kind == "datacenter")
        );
    }

    #[test]
    fn lookup_by_name_and_alias() {
        assert_eq!(find("rtx 4090").unwrap().name, "RTX 4090");
        assert_eq!(find("NVIDIA GeForce RTX 4090").unwrap().name, "RTX 4090");
        assert_eq!(find("a100").unwrap().name, "A100 80GB");
        assert_eq!(find("H100").unwrap().name, "H100 80GB");
        assert!(find("voodoo2").is_err());
        let t4 = find("t4").unwrap();
        assert!(smallest_fitting(t4.usable(), 0.0).unwrap().memory_mib <= t4.memory_mib);
        assert!(smallest_fitting(1 << 50, 0.0).is_none());
    }
}
