//! Units at the edge of the program.
//!
//! Everything inside prunemem counts bytes as `u64` and parameters as `u64`;
//! this module is the only place that turns them into text or reads them from
//! text. Binary units (KiB, MiB, GiB) are used for display; decimal units
//! (kB, MB, GB) are accepted on input with their true decimal meaning and are
//! never silently treated as binary ones.

use thiserror::Error;

/// Bytes in one gibibyte (2^30), the unit of the CSV log's `*_GB` columns.
pub const GIB: u64 = 1 << 30;
/// Bytes in one mebibyte (2^20).
pub const MIB: u64 = 1 << 20;

/// A number or size the user typed that could not be understood.
#[derive(Debug, Error, PartialEq)]
pub enum UnitError {
    #[error(
        "cannot read '{0}' as a size: expected a number with an optional unit such as 24GiB, 24GB or 512MiB"
    )]
    BadSize(String),
    #[error("cannot read '{0}' as a count: expected a number such as 7e9, 7B, 1.2b or 135M")]
    BadCount(String),
    #[error("'{0}' must be greater than zero")]
    NotPositive(String),
}

/// Formats bytes with binary units: `512 B`, `1.50 KiB`, `12.3 MiB`, `1.23 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let decimals = if value >= 100.0 {
        1
    } else if value >= 10.0 {
        2
    } else {
        3
    };
    format!("{value:.decimals$} {}", UNITS[unit])
}

/// Like [`format_bytes`], with `n/a` for a reading that is unavailable.
pub fn format_opt_bytes(bytes: Option<u64>) -> String {
    bytes.map(format_bytes).unwrap_or_else(|| "n/a".to_string())
}

/// Formats a signed byte difference with binary units and an explicit sign.
pub fn format_delta(delta: i128) -> String {
    let sign = if delta < 0 { "-" } else { "+" };
    format!(
        "{sign}{}",
        format_bytes(delta.unsigned_abs().min(u64::MAX as u128) as u64)
    )
}

/// Bytes as GiB (bytes / 1024^3), the unit of the CSV log.
pub fn to_gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

/// Formats a parameter count the way papers do: `135M`, `6.74B`, `70B`.
pub fn format_count(n: u64) -> String {
    let v = n as f64;
    if v >= 1e12 {
        format!("{:.3}T", v / 1e12)
    } else if v >= 1e9 {
        trim_decimals(v / 1e9, "B")
    } else if v >= 1e6 {
        trim_decimals(v / 1e6, "M")
    } else if v >= 1e3 {
        trim_decimals(v / 1e3, "K")
    } else {
        n.to_string()
    }
}

fn trim_decimals(v: f64, suffix: &str) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{suffix}")
}

/// Reads a memory size. `GiB`, `MiB`, `KiB`, `TiB` are binary; `GB`, `MB`,
/// `kB`, `TB` are decimal; a bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| UnitError::BadSize(text.to_string()))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kib" | "ki" => 1024.0,
        "mib" | "mi" => MIB as f64,
        "gib" | "gi" => GIB as f64,
        "tib" | "ti" => (GIB as f64) * 1024.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        _ => return Err(UnitError::BadSize(text.to_string())),
    };
    if !value.is_finite() {
        return Err(UnitError::BadSize(text.to_string()));
    }
    if value <= 0.0 {
        return Err(UnitError::NotPositive(text.to_string()));
    }
    let bytes = value * scale;
    if bytes >= u64::MAX as f64 {
        return Err(UnitError::BadSize(text.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// Reads a count such as a parameter count: `7e9`, `7B`, `1.2b`, `135M`,
/// `350k`, `6738415616`.
pub fn parse_count(text: &str) -> Result<u64, UnitError> {
    let t = text.trim().replace('_', "");
    let (num, scale) = match t.chars().last() {
        Some('b' | 'B') => (&t[..t.len() - 1], 1e9),
        Some('m' | 'M') => (&t[..t.len() - 1], 1e6),
        Some('k' | 'K') => (&t[..t.len() - 1], 1e3),
        Some('t' | 'T') => (&t[..t.len() - 1], 1e12),
        _ => (t.as_str(), 1.0),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| UnitError::BadCount(text.to_string()))?;
    if !value.is_finite() {
        return Err(UnitError::BadCount(text.to_string()));
    }
    if value <= 0.0 {
        return Err(UnitError::NotPositive(text.to_string()));
    }
    let n = value * scale;
    if n >= u64::MAX as f64 {
        return Err(UnitError::BadCount(text.to_string()));
    }
    Ok(n.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.500 KiB");
        assert_eq!(format_bytes(64 * MIB), "64.00 MiB");
        assert_eq!(format_bytes(3 * GIB / 2), "1.500 GiB");
        assert_eq!(format_opt_bytes(None), "n/a");
        assert_eq!(format_delta(-(MIB as i128)), "-1.000 MiB");
    }

    #[test]
    fn sizes_keep_decimal_and_binary_apart() {
        assert_eq!(parse_size("24GiB"), Ok(24 * GIB));
        assert_eq!(parse_size("24GB"), Ok(24_000_000_000));
        assert_eq!(parse_size("512 MiB"), Ok(512 * MIB));
        assert_eq!(parse_size("1.5gib"), Ok(3 * GIB / 2));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("24XB").is_err());
        assert!(parse_size("-3GB").is_err());
        assert!(parse_size("0").is_err());
    }

    #[test]
    fn counts_accept_paper_spellings() {
        assert_eq!(parse_count("7e9"), Ok(7_000_000_000));
        assert_eq!(parse_count("7B"), Ok(7_000_000_000));
        assert_eq!(parse_count("1.2b"), Ok(1_200_000_000));
        assert_eq!(parse_count("135M"), Ok(135_000_000));
        assert!(parse_count("-1").is_err());
        assert!(parse_count("0").is_err());
        assert!(parse_count("seven").is_err());
        assert_eq!(format_count(134_515_008), "134.52M");
        assert_eq!(format_count(7_000_000_000), "7B");
    }
}
