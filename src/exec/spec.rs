//! `--device`'s value: what a user types (`cpu`, `wgpu`, `wgpu:1`,
//! `wgpu:cpu`, `cuda`, `cuda:0`) parsed into a [`DeviceSpec`], and written
//! back the same way into the run's plan.

use std::fmt;
use std::str::FromStr;

/// Which wgpu adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgpuSelect {
    /// The highest-performance adapter wgpu finds (a discrete GPU first; on
    /// a machine with only Mesa's lavapipe, lavapipe).
    Default,
    /// The N-th discrete GPU.
    Discrete(usize),
    /// The software (CPU) adapter, such as lavapipe.
    Software,
}

/// The device a run computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// Burn's CPU backend (flex) with prunemem's CPU kernels.
    #[default]
    Cpu,
    /// Burn's wgpu backend (Vulkan, Metal, DX12) through cubecl.
    Wgpu(WgpuSelect),
    /// Burn's CUDA backend through cubecl, the N-th CUDA device.
    Cuda(usize),
}

impl DeviceSpec {
    /// True for a device with its own memory pool (not the CPU backend).
    pub fn is_device(&self) -> bool {
        !matches!(self, DeviceSpec::Cpu)
    }
}

impl FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        let (kind, index) = match t.split_once(':') {
            Some((k, i)) => (k, Some(i)),
            None => (t.as_str(), None),
        };
        let number = |i: &str| {
            i.parse::<usize>()
                .map_err(|_| format!("device index must be a number, got `{i}` in `{s}`"))
        };
        match (kind, index) {
            ("cpu", None) => Ok(DeviceSpec::Cpu),
            ("wgpu", None) => Ok(DeviceSpec::Wgpu(WgpuSelect::Default)),
            ("wgpu", Some("cpu")) => Ok(DeviceSpec::Wgpu(WgpuSelect::Software)),
            ("wgpu", Some(i)) => Ok(DeviceSpec::Wgpu(WgpuSelect::Discrete(number(i)?))),
            // Under MPI, each rank on a node takes its own card.
            ("cuda", None) => Ok(DeviceSpec::Cuda(super::launch::cuda_index_for(
                super::launch::local_rank(),
                std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref(),
            ))),
            ("cuda", Some(i)) => Ok(DeviceSpec::Cuda(number(i)?)),
            _ => Err(format!(
                "unknown device `{s}`: expected cpu, wgpu, wgpu:N, wgpu:cpu, cuda or cuda:N"
            )),
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Wgpu(WgpuSelect::Default) => write!(f, "wgpu"),
            DeviceSpec::Wgpu(WgpuSelect::Discrete(i)) => write!(f, "wgpu:{i}"),
            DeviceSpec::Wgpu(WgpuSelect::Software) => write!(f, "wgpu:cpu"),
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_users_type_and_writes_it_back() {
        for (text, spec, back) in [
            ("cpu", DeviceSpec::Cpu, "cpu"),
            ("wgpu", DeviceSpec::Wgpu(WgpuSelect::Default), "wgpu"),
            (
                "WGPU:1",
                DeviceSpec::Wgpu(WgpuSelect::Discrete(1)),
                "wgpu:1",
            ),
            (
                "wgpu:cpu",
                DeviceSpec::Wgpu(WgpuSelect::Software),
                "wgpu:cpu",
            ),
            ("cuda", DeviceSpec::Cuda(0), "cuda:0"),
            ("cuda:3", DeviceSpec::Cuda(3), "cuda:3"),
        ] {
            let parsed: DeviceSpec = text.parse().unwrap();
            assert_eq!(parsed, spec, "{text}");
            assert_eq!(parsed.to_string(), back);
            assert_eq!(back.parse::<DeviceSpec>().unwrap(), spec);
        }
    }

    #[test]
    fn rejects_unknown_devices_with_the_choices() {
        for bad in ["gpu", "cuda:x", "wgpu:-1", "metal", "cpu:0", ""] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(e.contains(bad) || e.contains("expected"), "{bad}: {e}");
        }
    }
}
