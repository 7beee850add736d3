//! The calibration windows' hidden states between decoder layers: on the
//! compute device, or — `--offload-activations`, for models whose
//! `nsamples × seqlen × hidden` activations do not fit beside a layer on the
//! card (the 30B/70B case) — in host memory, uploaded one batch at a time
//! for each pass and read back after the output pass.
//!
//! Offloading costs two transfers of every batch per layer (one upload for
//! the statistics pass, one upload and one read-back for the output pass)
//! and leaves on the device one batch and its layer's intermediates instead
//! of every batch.

use burn::prelude::*;

use crate::exec::Compute;
use crate::memory::held::{Held, tensor_bytes};
use crate::memory::tag::Category;

/// The hidden states of every calibration batch.
pub enum Activations<B: Compute> {
    /// On the compute device, and their bytes held there.
    Device(Vec<Tensor<B, 3>>, Held),
    /// In host memory, in the compute dtype.
    Host {
        batches: Vec<TensorData>,
        device: B::Device,
    },
}

impl<B: Compute> Activations<B> {
    /// No batches yet; those pushed are kept where `offload` says.
    pub fn empty(offload: bool, device: &B::Device) -> Self {
        match offload {
            false => Activations::Device(Vec::new(), Held::none(Category::Activations)),
            true => Activations::Host {
                batches: Vec::new(),
                device: device.clone(),
            },
        }
    }

    /// Adds the next batch (read back to the host at once when offloaded).
    pub fn push(&mut self, x: Tensor<B, 3>) {
        match self {
            Activations::Device(b, held) => {
                held.set(held.bytes() + tensor_bytes(&x));
                b.push(x)
            }
            Activations::Host { batches, .. } => batches.push(x.into_data()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Activations::Device(b, _) => b.len(),
            Activations::Host { batches, .. } => batches.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch `i` on the device.
    pub fn get(&self, i: usize) -> Tensor<B, 3> {
        match self {
            Activations::Device(b, _) => b[i].clone(),
            // In the dtype it was read back in: `from_data` alone would
            // upload in the backend's default float (f32 on wgpu).
            Activations::Host { batches, device } => {
                let data = batches[i].clone();
                let dtype = data.dtype;
                Tensor::from_data(data, (device, dtype))
            }
        }
    }

    /// Replaces batch `i` (the output pass's result).
    pub fn set(&mut self, i: usize, x: Tensor<B, 3>) {
        match self {
            Activations::Device(b, held) => {
                held.set(held.bytes() + tensor_bytes(&x) - tensor_bytes(&b[i]));
                b[i] = x
            }
            Activations::Host { batches, .. } => batches[i] = x.into_data(),
        }
    }

    /// True when the batches live in host memory.
    pub fn offloaded(&self) -> bool {
        matches!(self, Activations::Host { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Cpu;

    fn kept(batches: Vec<Tensor<Cpu, 3>>, offload: bool) -> Activations<Cpu> {
        let mut a = Activations::empty(offload, &Default::default());
        batches.into_iter().for_each(|b| a.push(b));
        a
    }

    #[test]
    fn offloaded_batches_come_back_as_they_went() {
        let device = Default::default();
        let x = |v: f32| Tensor::<Cpu, 3>::full([2, 3, 4], v, &device);
        for offload in [false, true] {
            let mut a = kept(vec![x(1.0), x(2.0)], offload);
            assert_eq!((a.len(), a.offloaded()), (2, offload));
            a.set(1, x(5.0));
            let got: Vec<f32> = a.get(1).into_data().into_vec().unwrap();
            assert_eq!(got, vec![5.0; 24]);
            let first: Vec<f32> = a.get(0).into_data().into_vec().unwrap();
            assert_eq!(first, vec![1.0; 24]);
        }
    }

    #[test]
    fn offloaded_f16_batches_come_back_in_f16() {
        let device = Default::default();
        let x = Tensor::<Cpu, 3>::full([2, 3, 4], 1.5, &device).cast(burn::tensor::FloatDType::F16);
        let a = kept(vec![x], true);
        assert_eq!(a.get(0).dtype(), burn::tensor::DType::F16);
    }
}
