//! The optimizer step, written out with Burn tensor ops so its memory can be
//! attributed: the moment buffers are allocated under the optimizer tag, the
//! updated parameters under the weights tag (Burn's own optimizers compute
//! both in one call, which charges the new parameters to whatever tag is
//! current). The formulas are `torch.optim`'s: AdamW with decoupled weight
//! decay, Adam with L2 decay added to the gradient, SGD with optional
//! momentum — so a step here and a step in a PyTorch script hold the same
//! state: two f32 moments per trainable parameter for Adam/AdamW, created at
//! the first `step()`, one momentum buffer for SGD with momentum, none
//! without.

use crate::memory::held::Held;
use std::collections::HashMap;

use burn::module::{ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

use crate::memory::tag::{self, Category};

/// Which update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerKind {
    AdamW,
    Adam,
    Sgd,
}

impl OptimizerKind {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::AdamW => "adamw",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Sgd => "sgd",
        }
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "adamw" => Ok(Self::AdamW),
            "adam" => Ok(Self::Adam),
            "sgd" => Ok(Self::Sgd),
            other => Err(format!(
                "unknown optimizer '{other}' (expected adamw, adam or sgd)"
            )),
        }
    }
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Hyper-parameters, with `torch.optim`'s defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerConfig {
    pub kind: OptimizerKind,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// SGD only.
    pub momentum: f64,
}

impl OptimizerConfig {
    /// `torch.optim`'s defaults for `kind` (AdamW decays 0.01, the others 0).
    pub fn new(kind: OptimizerKind) -> Self {
        Self {
            kind,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: if kind == OptimizerKind::AdamW {
                0.01
            } else {
                0.0
            },
            momentum: 0.0,
        }
    }

    /// f32 state buffers per trainable parameter once a step has run.
    pub fn state_buffers(&self) -> u64 {
        match self.kind {
            OptimizerKind::AdamW | OptimizerKind::Adam => 2,
            OptimizerKind::Sgd => u64::from(self.momentum != 0.0),
        }
    }
}

/// One parameter's state, flattened to rank 1 (the parameters have ranks 1
/// and 2; one map holds both).
struct State<B: Backend> {
    m: Tensor<B, 1>,
    v: Option<Tensor<B, 1>>,
}

/// The optimizer: its settings, the step count and the per-parameter state.
pub struct Optimizer<B: Backend> {
    pub config: OptimizerConfig,
    steps: i32,
    state: HashMap<ParamId, State<B>>,
    /// The state's bytes, for a device's composition (`memory::held`).
    held: Held,
}

impl<B: Backend> Optimizer<B> {
    pub fn new(config: OptimizerConfig) -> Self {
        Self {
            config,
            steps: 0,
            state: HashMap::new(),
            held: Held::none(Category::Optimizer),
        }
    }

    /// Bytes of state held now (0 before the first step).
    pub fn state_bytes(&self) -> u64 {
        let bytes = |t: &Tensor<B, 1>| t.dims()[0] as u64 * t.dtype().size() as u64;
        self.state
            .values()
            .map(|s| bytes(&s.m) + s.v.as_ref().map_or(0, bytes))
            .sum()
    }

    /// Applies one update to every parameter of `module` that has a
    /// gradient in `grads` (consumed as it goes, so each gradient is freed
    /// once its parameter is updated).
    pub fn step<AB, M>(&mut self, lr: f64, module: M, grads: GradientsParams) -> M
    where
        AB: AutodiffBackend<InnerBackend = B>,
        M: burn::module::AutodiffModule<AB>,
    {
        self.steps += 1;
        let mut mapper = StepMapper {
            opt: self,
            grads,
            lr,
        };
        let module = module.map(&mut mapper);
        self.held.set(self.state_bytes());
        module
    }

    /// The new value of one parameter (flattened).
    ///
    /// Written so that a parameter's update holds at most one temporary
    /// of its size beside its gradient, and no later moment of the update
    /// holds as much: the backend squares by multiplying two handles of
    /// one tensor (a new buffer) while the gradient is still needed; every
    /// other product is computed in a buffer whose only handle it consumes
    /// (the moments in their own, the update in the gradient's). Before,
    /// the denominator and the quotient were two temporaries after the
    /// gradient was freed: the same height as the squaring, in other
    /// categories, so which moment the heap's peak landed on was decided
    /// by a few bytes elsewhere (CI saw the other one, 2026-11-26).
    fn update(&mut self, id: ParamId, p: Tensor<B, 1>, g: Tensor<B, 1>, lr: f64) -> Tensor<B, 1> {
        let c = self.config;
        let t = self.steps;
        let _tag = tag::tag(Category::Optimizer);
        let (g, p) = match c.kind {
            OptimizerKind::Adam | OptimizerKind::Sgd if c.weight_decay != 0.0 => {
                let g = g + p.clone().mul_scalar(c.weight_decay);
                (g, p)
            }
            OptimizerKind::AdamW if c.weight_decay != 0.0 => {
                let p = tag::tagged(Category::Weights, || {
                    p.mul_scalar(1.0 - lr * c.weight_decay)
                });
                (g, p)
            }
            _ => (g, p),
        };
        let delta = match c.kind {
            OptimizerKind::Sgd if c.momentum == 0.0 => g.mul_scalar(lr),
            OptimizerKind::Sgd => {
                let (m, scratch) = match self.state.remove(&id) {
                    Some(s) => (s.m.mul_scalar(c.momentum) + g.clone(), g),
                    // torch clones the gradient: the state's own buffer.
                    None => (g.clone().mul_scalar(1.0), g),
                };
                let delta = overwrite(scratch, &m).mul_scalar(lr);
                self.state.insert(id, State { m, v: None });
                delta
            }
            OptimizerKind::Adam | OptimizerKind::AdamW => {
                let square = g.clone().square().mul_scalar(1.0 - c.beta2);
                let (m, v, scratch) = match self.state.remove(&id) {
                    Some(State { m, v: Some(v) }) => {
                        let v = v.mul_scalar(c.beta2) + square;
                        let g = g.mul_scalar(1.0 - c.beta1);
                        (m.mul_scalar(c.beta1) + g.clone(), v, g)
                    }
                    _ => (g.clone().mul_scalar(1.0 - c.beta1), square, g),
                };
                let bc1 = 1.0 - c.beta1.powi(t);
                let bc2 = 1.0 - c.beta2.powi(t);
                let denom = overwrite(scratch, &v)
                    .sqrt()
                    .div_scalar(bc2.sqrt())
                    .add_scalar(c.eps);
                let delta = denom.recip().mul(m.clone()).mul_scalar(lr / bc1);
                self.state.insert(id, State { m, v: Some(v) });
                delta
            }
        };
        drop(_tag);
        tag::tagged(Category::Weights, || p - delta)
    }
}

/// `value`'s elements in `scratch`'s buffer, where the backend computes in
/// a buffer whose only handle an operation consumes (Flex and cubecl do):
/// a copy of `value` that allocates nothing. Clamping to [0, 0] zeroes
/// every element, infinities included (a NaN stays NaN, as the sum would
/// be).
fn overwrite<B: Backend>(scratch: Tensor<B, 1>, value: &Tensor<B, 1>) -> Tensor<B, 1> {
    scratch.clamp(0.0, 0.0) + value.clone()
}

struct StepMapper<'a, B: Backend> {
    opt: &'a mut Optimizer<B>,
    grads: GradientsParams,
    lr: f64,
}

impl<AB: AutodiffBackend> ModuleMapper<AB> for StepMapper<'_, AB::InnerBackend> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<AB, D>>) -> Param<Tensor<AB, D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.remove::<AB::InnerBackend, D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let require_grad = tensor.is_require_grad();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let p = tensor.inner().reshape([n]);
        let updated = self.opt.update(id, p, grad.reshape([n]), self.lr);
        let mut t = Tensor::<AB, D>::from_inner(updated.reshape(shape));
        if require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    /// `torch.optim`'s update rules written out in f64 for one parameter
    /// vector, for `steps` gradients.
    fn reference(c: OptimizerConfig, lr: f64, p0: &[f64], grads: &[Vec<f64>]) -> Vec<f64> {
        let mut p = p0.to_vec();
        let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
        for (t, g) in grads.iter().enumerate() {
            let t = t as i32 + 1;
            for i in 0..p.len() {
                let mut gi = g[i];
                match c.kind {
                    OptimizerKind::AdamW => p[i] *= 1.0 - lr * c.weight_decay,
                    _ => gi += c.weight_decay * p[i],
                }
                if c.kind == OptimizerKind::Sgd {
                    m[i] = if t == 1 { gi } else { c.momentum * m[i] + gi };
                    p[i] -= lr * if c.momentum == 0.0 { gi } else { m[i] };
                    continue;
                }
                m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * gi;
                v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * gi * gi;
                let denom = (v[i] / (1.0 - c.beta2.powi(t))).sqrt() + c.eps;
                p[i] -= lr / (1.0 - c.beta1.powi(t)) * m[i] / denom;
            }
        }
        p
    }

    fn agrees_with_torch(c: OptimizerConfig) {
        let lr = 0.01;
        let p0 = [0.5, -1.25, 2.0, 0.0, -0.003, 1e-4];
        let grads: Vec<Vec<f64>> = (0..4)
            .map(|s| {
                let s = s as f64;
                vec![0.1 + s, -2.0 * s, 1e-3, -0.7, 3.0 - s, 1e-6 * s]
            })
            .collect();
        let want = reference(c, lr, &p0, &grads);
        let device = Default::default();
        let tensor = |x: &[f64]| {
            let x: Vec<f32> = x.iter().map(|&v| v as f32).collect();
            Tensor::<Flex, 1>::from_floats(x.as_slice(), &device)
        };
        let mut opt = Optimizer::<Flex>::new(c);
        let id = ParamId::new();
        let mut p = tensor(&p0);
        for g in &grads {
            opt.steps += 1;
            p = opt.update(id, p, tensor(g), lr);
        }
        let got: Vec<f32> = p.into_data().to_vec().unwrap();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let err = (*g as f64 - w).abs() / w.abs().max(1e-3);
            assert!(err < 1e-5, "{:?} element {i}: {g} against {w}", c.kind);
        }
        let expected_state = c.state_buffers() * p0.len() as u64 * 4;
        assert_eq!(opt.state_bytes(), expected_state, "{:?}", c.kind);
    }

    #[test]
    fn every_rule_matches_torch_optim_over_four_steps() {
        agrees_with_torch(OptimizerConfig::new(OptimizerKind::AdamW));
        let mut adam = OptimizerConfig::new(OptimizerKind::Adam);
        adam.weight_decay = 0.1;
        agrees_with_torch(adam);
        agrees_with_torch(OptimizerConfig::new(OptimizerKind::Sgd));
        let mut momentum = OptimizerConfig::new(OptimizerKind::Sgd);
        momentum.momentum = 0.9;
        momentum.weight_decay = 0.05;
        agrees_with_torch(momentum);
    }
}
