//! Pruning: methods (magnitude, Wanda, SparseGPT, GradProbe), the sparsity
//! patterns they produce, and the layer-by-layer engine that runs them on a
//! checkpoint.

pub mod engine;
pub mod gradprobe;
pub mod linalg;
pub mod methods;
pub mod sparsegpt;
pub mod stats;

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

use crate::data::DataError;
use crate::model::ModelError;

/// Which weights go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Magnitude,
    Wanda,
    SparseGpt,
    GradProbe,
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "magnitude" => Ok(Method::Magnitude),
            "wanda" => Ok(Method::Wanda),
            "sparsegpt" => Ok(Method::SparseGpt),
            "gradprobe" => Ok(Method::GradProbe),
            other => Err(format!(
                "unknown method '{other}' (expected magnitude, wanda, sparsegpt or gradprobe)"
            )),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Method::Magnitude => "magnitude",
            Method::Wanda => "wanda",
            Method::SparseGpt => "sparsegpt",
            Method::GradProbe => "gradprobe",
        })
    }
}

/// Unstructured, or N zeros in every group of M consecutive inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Pattern {
    Unstructured,
    NM { n: usize, m: usize },
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("unstructured") {
            return Ok(Pattern::Unstructured);
        }
        let bad =
            || format!("unknown sparsity type '{s}' (expected unstructured, 2:4, 4:8 or N:M)");
        let (n, m) = s.split_once(':').ok_or_else(bad)?;
        let n: usize = n.trim().parse().map_err(|_| bad())?;
        let m: usize = m.trim().parse().map_err(|_| bad())?;
        Ok(Pattern::NM { n, m })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Unstructured => f.write_str("unstructured"),
            Pattern::NM { n, m } => write!(f, "{n}:{m}"),
        }
    }
}

/// What can go wrong pruning.
#[derive(Debug, Error)]
pub enum PruneError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(
        "SparseGPT: the Hessian of {name} is not positive definite (pivot {index} is {value:.3e}); \
         raise --percdamp or use more calibration samples"
    )]
    NotPositiveDefinite {
        name: String,
        index: usize,
        value: f64,
    },
}

/// Checks a sparsity and pattern the way users expect.
pub fn validate(
    method: Method,
    sparsity: f64,
    pattern: Pattern,
    nsamples: usize,
) -> Result<(), PruneError> {
    if !(0.0..1.0).contains(&sparsity) || sparsity.is_nan() {
        return Err(PruneError::Invalid(format!(
            "--sparsity must be in [0, 1), got {sparsity}"
        )));
    }
    if method == Method::GradProbe && pattern != Pattern::Unstructured {
        return Err(PruneError::Invalid(
            "GradProbe prunes unstructured sparsity only (--sparsity-type unstructured)".into(),
        ));
    }
    if let Pattern::NM { n, m } = pattern {
        if n == 0 || m == 0 || n >= m {
            return Err(PruneError::Invalid(format!(
                "N:M sparsity needs 0 < N < M, got {n}:{m}"
            )));
        }
        let want = n as f64 / m as f64;
        if (sparsity - want).abs() > 1e-9 {
            return Err(PruneError::Invalid(format!(
                "{n}:{m} sparsity prunes exactly {want} of the weights; --sparsity must be {want}, got {sparsity}"
            )));
        }
    }
    if matches!(method, Method::Wanda | Method::SparseGpt) && nsamples == 0 {
        return Err(PruneError::Invalid("--nsamples must be at least 1".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let u = Pattern::Unstructured;
        assert!(validate(Method::Wanda, 0.5, u, 128).is_ok());
        assert!(validate(Method::Wanda, 1.0, u, 128).is_err());
        assert!(validate(Method::Wanda, -0.1, u, 128).is_err());
        assert!(validate(Method::Wanda, 0.5, u, 0).is_err());
        assert!(validate(Method::Magnitude, 0.5, u, 0).is_ok());
        assert!(validate(Method::Wanda, 0.5, "2:4".parse().unwrap(), 8).is_ok());
        assert!(validate(Method::Wanda, 0.6, "2:4".parse().unwrap(), 8).is_err());
        assert!(validate(Method::Wanda, 0.5, "4:4".parse().unwrap(), 8).is_err());
        assert!("2-4".parse::<Pattern>().is_err());
        assert_eq!("4:8".parse::<Pattern>().unwrap().to_string(), "4:8");
    }
}
