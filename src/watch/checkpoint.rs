//! The memory-logging scripts' own figures: the block a `Memory Checkpoint:
//! NAME` header is followed by (`GPU Memory:` then `Allocated: 2.30 GB`,
//! `Reserved:`, `Peak:`, `Free:`, `Total:`, and `CPU Memory: Used: 2.45 GB
//! (6.1%)`), read into the stage's allocator readings, so a watched
//! PyTorch run's log has the columns the script's own `memory_log.csv` has.
//!
//! Units are read as the scripts mean them: they divide by 1024³ and print
//! "GB" (`torch.cuda.memory_allocated() / 1024**3`), so `GB` and `GiB` are
//! 2^30 bytes and `MB`/`MiB` 2^20 — what makes prunemem's `GPU_*_GB` columns
//! (bytes / 2^30) equal the figures the script printed. A line that is not
//! part of the block ends it; a figure that is missing or malformed stays
//! unknown (`None`), never 0.

/// The figures of one block, each as printed (bytes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Figures {
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    pub peak: Option<u64>,
    pub free: Option<u64>,
    pub total: Option<u64>,
    pub cpu_used: Option<u64>,
    pub cpu_percent: Option<f64>,
}

impl Figures {
    /// Whether any figure was read.
    pub fn any(&self) -> bool {
        *self != Self::default()
    }
}

/// `2.30 GB` → bytes.
fn amount(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let unit = unit.split_whitespace().next().unwrap_or("");
    let unit = unit.trim_end_matches([',', ';', '|']);
    let scale = match unit {
        "GB" | "GiB" | "G" => (1u64 << 30) as f64,
        "MB" | "MiB" | "M" => (1u64 << 20) as f64,
        "KB" | "KiB" | "K" => 1024.0,
        "TB" | "TiB" => (1u64 << 40) as f64,
        "B" => 1.0,
        _ => return None,
    };
    let bytes = (value * scale).round();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// `(6.1%)` → 6.1.
fn percent(text: &str) -> Option<f64> {
    let open = text.find('(')?;
    let close = text[open..].find("%)")? + open;
    let p: f64 = text[open + 1..close].trim().parse().ok()?;
    (p.is_finite() && (0.0..=100.0).contains(&p)).then_some(p)
}

/// Reads one line of a block into `f`; false when the line is not part of
/// a block (the block ends there).
pub fn read_line(line: &str, f: &mut Figures) -> bool {
    let t = line.trim();
    if let Some(rest) = t.strip_prefix("CPU Memory:") {
        let rest = rest.trim();
        let used = rest.strip_prefix("Used:").unwrap_or(rest);
        f.cpu_used = amount(used);
        f.cpu_percent = percent(used);
        return true;
    }
    let t = t.strip_prefix("GPU Memory:").map_or(t, str::trim);
    if t.is_empty() || t.starts_with("none") {
        // The "GPU Memory:" line alone, or the probe's "no CUDA device".
        return true;
    }
    let mut known = false;
    // One figure a line, or several on one line split by ',' or '|'.
    for part in t.split([',', '|']) {
        let Some((key, value)) = part.split_once(':') else {
            continue;
        };
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            "allocated" => &mut f.allocated,
            "reserved" => &mut f.reserved,
            "peak" | "max allocated" | "max_allocated" | "peak allocated" => &mut f.peak,
            "free" => &mut f.free,
            "total" => &mut f.total,
            _ => continue,
        };
        known = true;
        *slot = amount(value);
    }
    known
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: f64 = (1u64 << 30) as f64;

    #[test]
    fn the_seed_block_is_read_as_printed() {
        let mut f = Figures::default();
        for line in [
            "GPU Memory:",
            "  Allocated: 2.30 GB",
            "  Reserved: 2.50 GB",
            "  Peak: 2.41 GB",
            "  Free: 77.50 GB",
            "  Total: 80.00 GB",
            "CPU Memory: Used: 2.45 GB (6.1%)",
        ] {
            assert!(read_line(line, &mut f), "{line}");
        }
        assert_eq!(f.allocated, Some((2.30 * GIB).round() as u64));
        assert_eq!(f.reserved, Some((2.50 * GIB).round() as u64));
        assert_eq!(f.peak, Some((2.41 * GIB).round() as u64));
        assert_eq!(f.total, Some(80 << 30));
        assert_eq!(f.cpu_used, Some((2.45 * GIB).round() as u64));
        assert_eq!(f.cpu_percent, Some(6.1));
        assert!(!read_line("loading model...", &mut f));
    }

    #[test]
    fn malformed_figures_stay_unknown() {
        let mut f = Figures::default();
        assert!(read_line("  Allocated: lots", &mut f));
        assert!(read_line("  Reserved: 12 parsecs", &mut f));
        assert!(read_line("  Peak: 1.5 MiB", &mut f));
        assert_eq!(f.allocated, None);
        assert_eq!(f.reserved, None);
        assert_eq!(f.peak, Some(1 << 20 | 1 << 19));
        let mut g = Figures::default();
        assert!(read_line(
            "GPU Memory: Allocated: 1 GiB, Reserved: 2 GiB",
            &mut g
        ));
        assert_eq!((g.allocated, g.reserved), (Some(1 << 30), Some(2 << 30)));
    }
}
