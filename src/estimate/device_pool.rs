//! What cubecl's pool reserves for prunemem's engine on a GPU beyond the
//! bytes in use, and what nvidia-smi shows for it.
//!
//! prunemem runs cubecl's persistent pool (`exec::cube`): every buffer is
//! allocated at its own size, a freed one is reused only by a tensor of
//! the same size, and what is free goes back to the driver at every layer
//! and phase boundary. Inside a pass the pool therefore keeps, for each
//! buffer size, as many buffers as the pass ever had alive at once: a
//! layer's forward leaves its norms' f32 copies, its attention scores and
//! its MLP products all reserved, though they are never alive together.
//! Reserved is the bytes in use outside the pass plus those pages.
//!
//! The pages of one layer's forward were counted from cubecl's own memory
//! log (`[memory.logger] level = "basic"` in a `cubecl.toml` lists the
//! pool's buffers by size at every new one) on lavapipe, cubecl 0.10, for
//! two synthetic shapes (64 and 96 wide, f16 and f32, Wanda and
//! SparseGPT); docs/gpu.md has the counts and the runs they were checked
//! on. Buffers of equal size share pages, so a size keeps the largest
//! count any of its buffers needs, not their sum.

use super::{Arch, Device, Phase, Workload};

/// cubecl's CUDA context and the driver's own allocations, which nvidia-smi
/// counts beside the pool: nvidia-smi's rise over a run less the pool's
/// reserved peak was 543, 568 and 640 MiB in three runs on one H100
/// (2026-11-26: the 7.55 GiB − 7.02 GiB, then 1B-shape Wanda runs
/// of `scripts/bench/cuda.sh`).
pub const CUDA_CONTEXT: u64 = 600 << 20;

/// What cubecl's pool reserves for a prunemem run, and what nvidia-smi
/// would show for it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DevicePool {
    /// The pool's highest reserved bytes: a phase's bytes in use outside
    /// its passes plus the pages its passes keep (`Phase::reserved`).
    pub reserved: u64,
    /// The phase it is reached in.
    pub phase: String,
    /// The CUDA context and driver allocations beside the pool (CUDA only).
    pub context: Option<u64>,
    /// `reserved + context`: nvidia-smi's `memory.used` for the process.
    pub nvidia_smi: Option<u64>,
}

/// The pool's reserve over `phases`: each phase's reserved bytes (its
/// bytes in use where it has none of its own).
pub fn pool(w: &Workload, phases: &[Phase]) -> DevicePool {
    let (reserved, phase) = phases
        .iter()
        .map(|p| (p.reserved.unwrap_or(0).max(p.total()), p.name.clone()))
        .max_by_key(|(b, _)| *b)
        .unwrap_or((0, String::new()));
    let context = (w.device == Device::Cuda).then_some(CUDA_CONTEXT);
    DevicePool {
        reserved,
        phase,
        context,
        nvidia_smi: context.map(|c| c + reserved),
    }
}

/// What a pass computes beside the forward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Beside {
    /// Nothing: the output pass, an evaluation.
    Nothing,
    /// Per-column norms (Wanda, RIA, DSnoT): the down projection's input
    /// in f32 beside the SiLU's.
    Norms,
    /// SparseGPT's Hessians: with more than one batch, each input's `XᵀX`
    /// beside the Hessian it is added to.
    Hessians { batches: u64 },
}

/// Buffer sizes and how many of each a pass keeps; equal sizes share.
#[derive(Default)]
struct Pages(Vec<(u64, u64)>);

impl Pages {
    fn add(mut self, bytes: u64, count: u64) -> Self {
        if bytes == 0 || count == 0 {
            return self;
        }
        match self.0.iter_mut().find(|(b, _)| *b == bytes) {
            Some((_, n)) => *n = (*n).max(count),
            None => self.0.push((bytes, count)),
        }
        self
    }

    /// Buffers alive at one moment: equal sizes add up there, then share
    /// with the rest.
    fn add_moment(self, buffers: &[(u64, u64)]) -> Self {
        let mut moment = Vec::<(u64, u64)>::new();
        for &(bytes, count) in buffers {
            match moment.iter_mut().find(|(b, _)| *b == bytes) {
                Some((_, n)) => *n += count,
                None => moment.push((bytes, count)),
            }
        }
        moment.into_iter().fold(self, |p, (b, n)| p.add(b, n))
    }

    fn total(&self) -> u64 {
        self.0.iter().map(|(b, n)| b * n).sum()
    }
}

/// The pages one decoder layer's forward keeps for batches of `batch`
/// windows, beside what the pass holds anyway (the layer, its inputs, the
/// rotary tables, the statistics).
pub fn forward(a: &Arch, w: &Workload, batch: u64, beside: Beside) -> u64 {
    let (c, s) = (w.dtype.size(), w.seqlen);
    let t = batch * s;
    let (h, kv, i, heads) = (a.hidden, a.kv_dim(), a.intermediate, a.heads);
    // In f32 the casts to f32 are no copies; their buffers are the
    // compute dtype's own sizes, which `Pages` merges.
    // The f32 pages a statistic takes of each input it reads: with Burn's
    // ops the norms square an f32 copy (2); SparseGPT's `XᵀX` and DSnoT's
    // moments are made from a copy (1); the norms' kernel reads the input
    // as it is (0). The SiLU's and the RMS norm's own f32 pages are shared
    // with these where they have any: without a statistic the SiLU keeps
    // one page and prunemem's kernel none (cubecl's log on lavapipe: 110
    // KiB fewer on the 96-wide fixture's magnitude run), the RMS norm two
    // with Burn's ops and none with its kernel.
    let squares = beside == Beside::Norms && !w.norms_kernel;
    let copied = match beside {
        Beside::Hessians { .. } => true,
        Beside::Norms => squares || w.dsnot,
        Beside::Nothing => false,
    };
    let stat_f32 = u64::from(copied) + u64::from(squares);
    let silu_f32 = match stat_f32 {
        0 => 1 - u64::from(w.swiglu_kernel),
        n => n,
    };
    let norm_f32 = if w.rms_norm_kernel { stat_f32 } else { 2 };
    // DSnoT's per-window vectors (traced with the norms' kernel only).
    let moments = beside == Beside::Norms && w.norms_kernel && w.dsnot;
    let mut pages = Pages::default()
        // The normed input, q, the rotation, the attention's output and
        // o_proj's, the residual: four alive at most.
        .add(t * h * c, 4)
        // The f32 pages of the hidden-wide inputs (above).
        .add(t * h * 4, norm_f32)
        // k and v.
        .add(t * kv * c, 2)
        // gate, up and their product (written over the gate by the
        // in-place kernel).
        .add(t * i * c, 3 - u64::from(w.swiglu_in_place))
        // The f32 pages of the down projection's input (above).
        .add(t * i * 4, silu_f32)
        // The norm's mean per token.
        .add(t * 4, u64::from(!w.rms_norm_kernel));
    if !w.fused_attention {
        // Burn's attention: the scores, its causal mask (built from two
        // position tables), the softmax's rows. The flash kernel
        // keeps none of them (cubecl's log on lavapipe: 48 000 bytes fewer
        // on the 96-wide fixture's batch of 2, exactly these).
        pages = pages
            .add(batch * heads * s * s * c, 1)
            .add(s * s * 4, 1)
            .add(batch * heads * s * 4, if c == 4 { 2 } else { 1 })
            .add(batch * heads * s * c, if c == 4 { 0 } else { 1 })
            .add(s * 4, 2);
    }
    if moments {
        // DSnoT's per-window sums and variances (cubecl's log on lavapipe,
        // the 96-wide fixture: 8 hidden-wide and 4 intermediate-wide f32
        // vectors beside the copy), and, window by window, each input's
        // centred f32 copy beside the input, its f32 copy and (past the
        // first window of a batch, whose slice is the copy's start) the
        // window's slice made contiguous.
        let windows = 1 + u64::from(batch > 1);
        pages = pages.add(h * 4, 8).add(i * 4, 4);
        for width in [h, i] {
            pages = pages.add_moment(&[
                (t * width * c, 1),
                (t * width * 4, 1),
                (s * width * 4, windows),
            ]);
        }
    }
    if let Beside::Hessians { batches } = beside
        && batches > 1
    {
        pages = pages.add(h * h * 4, 1).add(i * i * 4, 1);
    }
    pages.total()
}

/// GradProbe's step 6 (`prune::gradprobe::write::keep_pruned`): the pages
/// the larger of two moments keeps, the pool emptied between them. Zeroing
/// one linear of `(parameters, positions)` at a time
/// (`on_device::zero_at`, in the weight's own buffer: the layer is its
/// only holder): the zeros' mask (a 4-byte bool on wgpu, one byte on
/// CUDA) and its integer copy, counted on the device; the positions as
/// indices and the values written there. Then a layer's evaluation
/// forward of `batch` windows. cubecl's memory log on lavapipe, the
/// 256-wide fixture (96 windows of 32 in batches of 8): three pages of
/// each linear's size and two of its positions' length while the scatter
/// copied the weight (2026-11-29), two since it writes in place
/// (2026-12-01).
pub fn zeroed_forward(a: &Arch, w: &Workload, batch: u64, linears: &[(u64, u64)]) -> u64 {
    let bool_bytes = match w.device {
        Device::Cuda => 1,
        _ => 4,
    };
    let zeroing = linears.iter().map(|&(params, positions)| {
        Pages::default()
            .add_moment(&[(params * 4, 1), (params * bool_bytes, 1)])
            .add(positions * 4, 2)
            .total()
    });
    let forward = forward(a, w, batch, Beside::Nothing);
    zeroing.fold(forward, u64::max)
}

/// The pages the evaluation's head keeps for a batch of `batch` windows:
/// the final norm (the normed batch; with Burn's ops its f32 copy and
/// square) and, window
/// by window, a logits chunk of `rows` rows, its losses and the targets.
pub fn head(a: &Arch, w: &Workload, batch: u64, rows: u64) -> u64 {
    let (c, s, h) = (w.dtype.size(), w.seqlen, a.hidden);
    let t = batch * s;
    let norm = u64::from(!w.rms_norm_kernel);
    Pages::default()
        .add(t * h * c, 1)
        .add(t * h * 4, 2 * norm)
        .add(t * 4, norm)
        .add(rows * a.vocab * c, 1)
        .add(rows * 4, 1)
        .add((s - 1) * 4, 1)
        .total()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Task;
    use crate::model::ComputeDtype;

    fn fixture(hidden: u64, inter: u64, heads: u64, kv_heads: u64) -> Arch {
        Arch {
            name: "fixture".into(),
            params: 0,
            layers: 2,
            hidden,
            intermediate: inter,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            vocab: 300,
            tied: true,
            max_positions: 256,
        }
    }

    /// cubecl's memory log on lavapipe at the end of a Wanda statistics
    /// pass in f16 over a 96-wide layer (6 heads, 2 of k/v, 352
    /// intermediate), 3 windows of 40 tokens in one batch: every buffer the
    /// pool held, less the layer's weights, the calibration batch, the
    /// rotary tables and the statistics, as (bytes, buffers).
    const LOGGED: [(u64, u64); 11] = [
        (160, 2),
        (480, 1),
        (1440, 1),
        (2880, 1),
        (6400, 1),
        (7680, 2),
        (23040, 4),
        (46080, 2),
        (57600, 1),
        (84480, 3),
        (168960, 2),
    ];

    #[test]
    fn a_layers_pages_are_the_ones_cubecl_kept() {
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F16, 40);
        let logged: u64 = LOGGED.iter().map(|(b, n)| b * n).sum();
        assert_eq!(forward(&a, &w, 3, Beside::Norms), logged);
        // The output pass (the same log): one f32 copy of the SiLU's
        // input fewer.
        assert_eq!(forward(&a, &w, 3, Beside::Nothing), logged - 168960);
    }

    #[test]
    fn the_flash_kernel_keeps_no_scores() {
        // cubecl's log of the 96-wide fixture's Wanda statistics pass in
        // f16, 2 windows of 40 tokens a batch: 914 732 bytes held with
        // Burn's attention, 866 732 with the flash kernel (`unit`).
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F16, 40);
        let burns = forward(&a, &w, 2, Beside::Norms);
        w.fused_attention = true;
        assert_eq!(burns - forward(&a, &w, 2, Beside::Norms), 914_732 - 866_732);
    }

    #[test]
    fn the_norms_kernel_keeps_no_copy_of_the_input() {
        // cubecl's log of the 96-wide fixture's Wanda statistics pass in
        // f16 (first layer, 2 windows of 40 tokens a batch, flash
        // attention): 866 732 bytes held with Burn's ops for the norms,
        // 641 452 with the kernel: the down projection's input's f32 copy
        // and its square. DSnoT's moments keep the copy (and 764.9 KiB
        // reserved over that run: see `estimate --against` in docs/gpu.md).
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F16, 40);
        (w.fused_attention, w.swiglu_kernel) = (true, true);
        let burns = forward(&a, &w, 2, Beside::Norms);
        w.norms_kernel = true;
        let kernel = forward(&a, &w, 2, Beside::Norms);
        assert_eq!(burns - kernel, 866_732 - 641_452);
        assert_eq!(kernel, forward(&a, &w, 2, Beside::Nothing));
        w.dsnot = true;
        // The log: 121 352 bytes more (its sizes are rounded to 10 bytes).
        let moments = 80 * 352 * 4 + 8 * 96 * 4 + 4 * 352 * 4;
        assert_eq!(forward(&a, &w, 2, Beside::Norms) - kernel, moments);
    }

    #[test]
    fn the_rms_norm_kernel_keeps_no_copy_of_the_batch() {
        // cubecl's log of the same fixture and pass with the norms' kernel:
        // 641 452 bytes held with Burn's ops for the RMS norm, 579 692 with
        // its kernel (the f32 copy, its square, the mean per token); at the
        // evaluation's head (a batch of 2 windows) 699 816 and 638 056.
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F16, 40);
        (w.fused_attention, w.swiglu_kernel, w.norms_kernel) = (true, true, true);
        let (burns, burns_head) = (forward(&a, &w, 2, Beside::Norms), head(&a, &w, 2, 39));
        w.rms_norm_kernel = true;
        assert_eq!(burns - forward(&a, &w, 2, Beside::Norms), 641_452 - 579_692);
        assert_eq!(burns_head - head(&a, &w, 2, 39), 699_816 - 638_056);
        // SparseGPT's `XᵀX` still takes the hidden-wide inputs in f32.
        let hessians = Beside::Hessians { batches: 1 };
        let kept = forward(&a, &w, 2, hessians);
        w.rms_norm_kernel = false;
        assert_eq!(forward(&a, &w, 2, hessians) - kept, 80 * 96 * 4 + 80 * 4);
    }

    #[test]
    fn the_in_place_swiglu_keeps_two_mlp_pages() {
        // cubecl's log of the same fixture and pass with every kernel:
        // 579 692 bytes held when the SwiGLU wrote a new tensor, 523 372
        // when it writes over the gate (one 2 × 40 × 352 f16 page); the
        // output pass's last batch (1 window) 482 412 and 454 252.
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F16, 40);
        (w.fused_attention, w.swiglu_kernel) = (true, true);
        (w.norms_kernel, w.rms_norm_kernel) = (true, true);
        let (stats, output) = (
            forward(&a, &w, 2, Beside::Norms),
            forward(&a, &w, 1, Beside::Nothing),
        );
        w.swiglu_in_place = true;
        assert_eq!(stats - forward(&a, &w, 2, Beside::Norms), 579_692 - 523_372);
        assert_eq!(
            output - forward(&a, &w, 1, Beside::Nothing),
            482_412 - 454_252
        );
        // DSnoT's statistics pass, the same logs with `--dsnot`, in batches
        // of 2 and of 1 windows: 731 764 against 523 372, 550 004 against
        // 397 932. The log rounds the 352-wide vectors to 1 410 bytes, 8
        // bytes over the four of them. Its window copies then outnumber
        // the MLP's pages, which the in-place kernel no longer covers.
        for (batch, dsnot, wanda) in [(2, 731_764, 523_372), (1, 550_004, 397_932)] {
            let plain = forward(&a, &w, batch, Beside::Norms);
            w.dsnot = true;
            let moments = forward(&a, &w, batch, Beside::Norms) - plain;
            w.dsnot = false;
            assert_eq!(moments + 8, dsnot - wanda, "batch {batch}");
        }
    }

    #[test]
    fn equal_sizes_share_their_pages() {
        let a = fixture(96, 352, 6, 2);
        let mut w = Workload::new(Task::Wanda);
        (w.dtype, w.seqlen) = (ComputeDtype::F32, 40);
        let t = 120;
        // In f32 the norm's copy is the hidden states' own size (4 pages,
        // not 6) and the SiLU's the MLP's (3, not 5).
        let f32s = forward(&a, &w, 3, Beside::Norms);
        let counted = 4 * t * 96 * 4
            + 2 * t * 32 * 4
            + 3 * t * 352 * 4
            + 3 * 6 * 40 * 40 * 4
            + 40 * 40 * 4
            + 2 * 3 * 6 * 40 * 4
            + t * 4
            + 2 * 40 * 4;
        assert_eq!(f32s, counted);
    }

    #[test]
    fn a_second_batch_of_sparsegpt_keeps_a_product_beside_each_hessian() {
        let a = fixture(96, 352, 6, 2);
        let w = Workload::new(Task::SparseGpt);
        let one = forward(&a, &w, 8, Beside::Hessians { batches: 1 });
        let four = forward(&a, &w, 8, Beside::Hessians { batches: 4 });
        assert_eq!(four - one, (96 * 96 + 352 * 352) * 4);
    }
}
