//! Pruning: methods (magnitude, Wanda, SparseGPT, GradProbe), the sparsity
//! patterns they produce, and the layer-by-layer engine that runs them on a
//! checkpoint.

pub mod activations;
pub mod config;
pub mod dsnot;
pub mod dsnot_device;
pub mod engine;
pub mod factor_device;
pub mod gradprobe;
pub mod linalg;
pub mod linear;
pub mod methods;
pub mod on_device;
pub mod owl;
pub mod reallocation;
pub mod reallocation_device;
pub mod sparsegpt;
pub mod sparsegpt_device;
pub mod stats;
pub mod variant;
pub mod variant_device;

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
    /// Relative importance and activations (RIA).
    Ria,
}

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "magnitude" => Ok(Method::Magnitude),
            "wanda" => Ok(Method::Wanda),
            "sparsegpt" => Ok(Method::SparseGpt),
            "gradprobe" => Ok(Method::GradProbe),
            "ria" => Ok(Method::Ria),
            other => Err(format!(
                "unknown method '{other}' (expected magnitude, wanda, sparsegpt, gradprobe or ria)"
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
            Method::Ria => "ria",
        })
    }
}

/// The methods the layer-by-layer engine ([`engine`]) runs: everything but
/// GradProbe, which has its own gradient pass ([`gradprobe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerMethod {
    Magnitude,
    Wanda,
    SparseGpt,
    Ria,
}

impl TryFrom<Method> for LayerMethod {
    type Error = PruneError;
    fn try_from(m: Method) -> Result<Self, PruneError> {
        match m {
            Method::Magnitude => Ok(LayerMethod::Magnitude),
            Method::Wanda => Ok(LayerMethod::Wanda),
            Method::SparseGpt => Ok(LayerMethod::SparseGpt),
            Method::Ria => Ok(LayerMethod::Ria),
            Method::GradProbe => Err(PruneError::Invalid(
                "GradProbe runs through prune::gradprobe, not the layer-by-layer engine".into(),
            )),
        }
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
         raise the dampening (percdamp) or use more calibration samples"
    )]
    NotPositiveDefinite {
        name: String,
        index: usize,
        value: f64,
    },
}

impl From<crate::memory::DeviceOom> for PruneError {
    fn from(e: crate::memory::DeviceOom) -> Self {
        PruneError::Model(ModelError::DeviceOom(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_and_methods_parse() {
        assert!("2-4".parse::<Pattern>().is_err());
        assert_eq!("4:8".parse::<Pattern>().unwrap().to_string(), "4:8");
        assert_eq!(
            LayerMethod::try_from(Method::Wanda).unwrap(),
            LayerMethod::Wanda
        );
        assert!(LayerMethod::try_from(Method::GradProbe).is_err());
    }
}
