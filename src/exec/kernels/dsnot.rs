//! DSnoT's swap loop in one launch: one unit per output (a column of
//! Burn's `[in, out]` layout) walks the host's loop (`prune::dsnot`) for
//! its row, every cycle in registers. Written with Burn's ops
//! (`prune::dsnot_device`) every cycle is about 115 launches unstructured
//! and 78 at N:M, the whole matrix stepping at once, and a flag comes back
//! every 8 cycles: on lavapipe the loop was bound by its launches (3.8 to
//! 4.4 s for a 384 × 1024 fixture's 8 linears, 1.0 s in one launch each;
//! docs/gpu.md).
//!
//! A cursor's next position is the lexicographic successor (or
//! predecessor) of its last `(key, input)` pair among its list's entries,
//! as the ops find it, here in one pass over the list. The lists are the
//! ops' own: windows of `max_cycles` entries, or a whole column (its
//! inputs implicit, an `among` flag saying which entries count), read in
//! either layout a weight comes in. Each unit copies its column of the
//! first mask (and of N:M's metric) into a new buffer and changes only
//! that column, so nothing is shared between units.
//!
//! The arithmetic is the host's, one f32 operation at a time: the error
//! moves by `(err + d_prune) - d_regrow`.

use cubecl::prelude::*;

/// Below every key (a key is at least `-bits(inf) - 1`).
const BEFORE: i32 = -2_147_483_647;
/// Above every key but NaN's (`i32::MAX`).
const AFTER: i32 = 2_147_483_647;

/// Where entry `i` of column `col` lies in a `[len, cols]` buffer laid
/// out row-major, or column-major where `transposed` (the two layouts a
/// weight and what is made from it come in).
#[cube]
fn at(i: usize, col: usize, len: usize, cols: usize, transposed: bool) -> usize {
    let mut p = i * cols + col;
    if transposed {
        p = col * len + i;
    }
    p
}

/// Bit `b` of `layout`: whether buffer `b` is column-major.
#[cube]
fn bit(layout: u32, b: u32) -> bool {
    ((layout >> b) & 1u32) == 1u32
}

/// The pair after `(pk, pr)` in ascending `(key, input)` order (`up`) or
/// before it in descending order, among the `len` entries of column `col`
/// whose `among` flag is set where `filtered`; an entry's input is
/// `rows[..]` where `explicit`, else its own position. `t` gives the three
/// buffers' layouts ([`at`]). `(pk, pr)` again where there is none (the
/// caller counts its takes).
#[cube]
#[allow(clippy::too_many_arguments)]
fn successor(
    keys: &Array<i32>,
    rows: &Array<i32>,
    among: &Array<i32>,
    explicit: bool,
    filtered: bool,
    t: (bool, bool, bool),
    len: usize,
    cols: usize,
    col: usize,
    pk: i32,
    pr: i32,
    #[comptime] up: bool,
) -> (i32, i32) {
    let (tk, tr, ta) = t;
    let mut bk = pk;
    let mut br = pr;
    let mut found = false;
    for i in 0..len {
        let k = keys[at(i, col, len, cols, tk)];
        let mut r = i32::cast_from(i);
        if explicit {
            r = rows[at(i, col, len, cols, tr)];
        }
        let mut beyond = false;
        if comptime!(up) {
            beyond = k > pk || (k == pk && r > pr);
        } else {
            beyond = k < pk || (k == pk && r < pr);
        }
        if filtered {
            beyond = beyond && among[at(i, col, len, cols, ta)] != 0i32;
        }
        if beyond {
            let mut better = !found;
            if comptime!(up) {
                better = better || k < bk || (k == bk && r < br);
            } else {
                better = better || k > bk || (k == bk && r > br);
            }
            if better {
                bk = k;
                br = r;
                found = true;
            }
        }
    }
    (bk, br)
}

/// `x` as a runtime value (a constant, negated ones included, is a
/// compile-time value in cubecl's language, and cannot be assigned a
/// runtime one later).
#[cube]
fn var(x: i32) -> i32 {
    x
}

/// `torch.sign` as an integer (NaN: 0, as the host's).
#[cube]
fn sign_of(x: f32) -> i32 {
    let mut s = 0i32;
    if x > f32::new(0.0) {
        s = 1i32;
    } else if x < f32::new(0.0) {
        s = -1i32;
    }
    s
}

/// The bits of a launch's `layout` ([`bit`]): which buffers are
/// column-major.
pub(super) mod layout {
    pub const D: u32 = 0;
    pub const FIRST: u32 = 1;
    pub const FRONT_KEYS: u32 = 2;
    pub const FRONT_ROWS: u32 = 3;
    pub const BACK_KEYS: u32 = 4;
    pub const BACK_ROWS: u32 = 5;
    pub const KEYS_0: u32 = 6;
    pub const ROWS_0: u32 = 7;
    pub const KEYS_1: u32 = 8;
    pub const ROWS_1: u32 = 9;
    pub const AMONG_0: u32 = 10;
    pub const AMONG_1: u32 = 11;
    pub const METRIC: u32 = 12;
}

/// The regrowing cursors of one column: the front's and the back's last
/// pairs and takes.
#[derive(CubeType)]
struct Regrow {
    f_k: i32,
    f_r: i32,
    f_n: u32,
    b_k: i32,
    b_r: i32,
    b_n: u32,
}

/// The regrowing cursors before their first step.
#[cube]
fn regrow_start(rows: u32) -> Regrow {
    Regrow {
        f_k: var(BEFORE),
        f_r: var(-1i32),
        f_n: 0u32,
        b_k: var(AFTER),
        b_r: i32::cast_from(rows),
        b_n: 0u32,
    }
}

/// This cycle's regrow candidate `(key, input)` of column `col`, and
/// whether the cursor it comes from still has one: the back's (the
/// largest score first) where `from_back`, else the front's. The lists
/// are `len` rows, inputs named where `explicit`, laid out as `layout`
/// says.
#[cube]
#[allow(clippy::too_many_arguments)]
fn regrow_next(
    g: &Regrow,
    fk: &Array<i32>,
    fr: &Array<i32>,
    bk: &Array<i32>,
    br: &Array<i32>,
    explicit: bool,
    layout: u32,
    len: usize,
    cols: usize,
    col: usize,
    rows: u32,
    from_back: bool,
) -> (i32, i32, bool) {
    let mut rk = 0i32;
    let mut rr = 0i32;
    let mut has = false;
    if from_back {
        let t = (bit(layout, 4u32), bit(layout, 5u32), false);
        let (k, r) = successor(
            bk, br, bk, explicit, false, t, len, cols, col, g.b_k, g.b_r, false,
        );
        rk = k;
        rr = r;
        has = g.b_n < rows;
    } else {
        let t = (bit(layout, 2u32), bit(layout, 3u32), false);
        let (k, r) = successor(
            fk, fr, fk, explicit, false, t, len, cols, col, g.f_k, g.f_r, true,
        );
        rk = k;
        rr = r;
        has = g.f_n < rows;
    }
    (rk, rr, has)
}

/// Column `col` of `src` (`[n, c]`, column-major where `transposed`)
/// into `dst` (row-major).
#[cube]
fn copy_column(
    src: &Array<i32>,
    dst: &mut Array<i32>,
    n: usize,
    c: usize,
    col: usize,
    transposed: bool,
) {
    for i in 0..n {
        dst[i * c + col] = src[at(i, col, n, c, transposed)];
    }
}

/// Unstructured DSnoT, one unit per column. `first` (the first mask, 1
/// pruned) is copied into `mask` (`[rows, cols]`, row-major) and changed
/// there; `d` (`W·x̄`, `[rows, cols]`); `err`: each column's first error;
/// the regrowing lists, front (most negative score first) and back, each
/// `regrow_len` rows (whole columns, inputs implicit, where
/// `regrow_whole`). The prune order's ends: end 0 (walked where the error
/// is not negative) takes `k0`/`r0`, end 1 `k1`/`r1`, `prune_len` rows;
/// where `prune_whole` they are whole columns filtered by `a0`/`a1`, and
/// an end past its own sign takes the smallest kept weight once for each
/// zero, then the other end's list from its far side. `ends` (`[7,
/// cols]`, row-major): per end its own count, its zeros' end and its end,
/// then the smallest kept weight. `swaps` gets each column's swap count.
/// `layout`'s bits ([`layout`]) say which inputs are column-major.
#[cube(launch_unchecked)]
// `!(|e| <= threshold)`: a NaN error does not stop a row, as on the host.
#[allow(clippy::too_many_arguments, clippy::neg_cmp_op_on_partial_ord)]
pub(super) fn dsnot_unstructured(
    d: &Array<f32>,
    first: &Array<i32>,
    mask: &mut Array<i32>,
    err: &Array<f32>,
    fk: &Array<i32>,
    fr: &Array<i32>,
    bk: &Array<i32>,
    br: &Array<i32>,
    k0: &Array<i32>,
    r0: &Array<i32>,
    k1: &Array<i32>,
    r1: &Array<i32>,
    a0: &Array<i32>,
    a1: &Array<i32>,
    ends: &Array<i32>,
    swaps: &mut Array<i32>,
    rows: u32,
    cols: u32,
    regrow_len: u32,
    prune_len: u32,
    regrow_whole: u32,
    prune_whole: u32,
    cycles: u32,
    threshold: f32,
    layout: u32,
) {
    let col = ABSOLUTE_POS;
    let c = cols as usize;
    let n = rows as usize;
    if col < c {
        let td = bit(layout, 0u32);
        copy_column(first, mask, n, c, col, bit(layout, 1u32));
        let rl = regrow_len as usize;
        let pl = prune_len as usize;
        // Whether the regrowing lists name their inputs; whether the prune
        // lists are whole columns.
        let rx = regrow_whole == 0u32;
        let whole = prune_whole != 0u32;
        let t0 = (bit(layout, 6u32), bit(layout, 7u32), bit(layout, 10u32));
        let t1 = (bit(layout, 8u32), bit(layout, 9u32), bit(layout, 11u32));
        let mut e = err[col];
        let mut g = regrow_start(rows);
        // Per prune end: its takes, its own list's cursor, the other's.
        let mut taken = Array::<i32>::new(2usize);
        let mut own_k = Array::<i32>::new(2usize);
        let mut own_r = Array::<i32>::new(2usize);
        let mut oth_k = Array::<i32>::new(2usize);
        let mut oth_r = Array::<i32>::new(2usize);
        for end in 0..2usize {
            taken[end] = 0i32;
            own_k[end] = BEFORE;
            own_r[end] = -1i32;
            oth_k[end] = AFTER;
            oth_r[end] = i32::cast_from(rows);
        }
        let kept0 = ends[6usize * c + col];
        let mut active = true;
        let mut count = 0i32;
        for _ in 0..cycles {
            if active {
                // This cycle's regrow candidate.
                let from_back = e > f32::new(0.0);
                let (rk, rr, r_has) =
                    regrow_next(&g, fk, fr, bk, br, rx, layout, rl, c, col, rows, from_back);
                // This cycle's prune candidate: negative errors prune from
                // the back (end 1).
                let mut end = 0usize;
                if e < f32::new(0.0) {
                    end = 1usize;
                }
                let t = taken[end];
                let own_n = ends[(3usize * end) * c + col];
                let zeros_end = ends[(3usize * end + 1usize) * c + col];
                let last = ends[(3usize * end + 2usize) * c + col];
                let in_own = t < own_n;
                let mut in_other = false;
                let mut p_has = in_own;
                let mut pk = 0i32;
                let mut pr = 0i32;
                if in_own {
                    if end == 0usize {
                        let (k, r) = successor(
                            k0,
                            r0,
                            a0,
                            !whole,
                            whole,
                            t0,
                            pl,
                            c,
                            col,
                            own_k[0usize],
                            own_r[0usize],
                            true,
                        );
                        pk = k;
                        pr = r;
                    } else {
                        let (k, r) = successor(
                            k1,
                            r1,
                            a1,
                            !whole,
                            whole,
                            t1,
                            pl,
                            c,
                            col,
                            own_k[1usize],
                            own_r[1usize],
                            true,
                        );
                        pk = k;
                        pr = r;
                    }
                } else if whole {
                    p_has = t < last;
                    if t < zeros_end {
                        pr = kept0;
                    } else if p_has {
                        in_other = true;
                        // The other end's own list, from its far side.
                        if end == 0usize {
                            let (k, r) = successor(
                                k1,
                                r1,
                                a1,
                                false,
                                true,
                                t1,
                                pl,
                                c,
                                col,
                                oth_k[0usize],
                                oth_r[0usize],
                                false,
                            );
                            pk = k;
                            pr = r;
                        } else {
                            let (k, r) = successor(
                                k0,
                                r0,
                                a0,
                                false,
                                true,
                                t0,
                                pl,
                                c,
                                col,
                                oth_k[1usize],
                                oth_r[1usize],
                                false,
                            );
                            pk = k;
                            pr = r;
                        }
                    }
                }
                let mut take = r_has && p_has && !(f32::abs(e) <= threshold);
                if take {
                    let ra = rr as usize * c + col;
                    let pa = pr as usize * c + col;
                    take = mask[ra] == 1i32 && mask[pa] == 0i32;
                    if take {
                        mask[pa] = 1i32;
                        mask[ra] = 0i32;
                        e = (e + d[at(pr as usize, col, n, c, td)])
                            - d[at(rr as usize, col, n, c, td)];
                        count += 1i32;
                        advance(&mut g, from_back, rk, rr);
                        if in_own {
                            own_k[end] = pk;
                            own_r[end] = pr;
                        } else if in_other {
                            oth_k[end] = pk;
                            oth_r[end] = pr;
                        }
                        taken[end] = t + 1i32;
                    }
                }
                active = take;
            }
        }
        swaps[col] = count;
    }
}

/// The regrowing cursor that gave this cycle's candidate `(k, r)` moves
/// to it.
#[cube]
fn advance(g: &mut Regrow, from_back: bool, k: i32, r: i32) {
    if from_back {
        g.b_k = k;
        g.b_r = r;
        g.b_n += 1u32;
    } else {
        g.f_k = k;
        g.f_r = r;
        g.f_n += 1u32;
    }
}

/// N:M DSnoT, one unit per column: `first`, `mask`, `d` and the
/// regrowing lists as for [`dsnot_unstructured`]; `first_metric` (`[rows,
/// cols]`, the first metric's keys, the pruned ones raised) is copied
/// into `metric` (row-major), where a weight pruned by a swap takes
/// `max_value` (`[cols]`). Each swap regrows the next pruned weight and
/// prunes the first smallest of its group of `m`, while the error keeps
/// its first sign.
#[cube(launch_unchecked)]
// `!(|e| <= threshold)`: a NaN error does not stop a row, as on the host.
#[allow(clippy::too_many_arguments, clippy::neg_cmp_op_on_partial_ord)]
pub(super) fn dsnot_nm(
    d: &Array<f32>,
    first: &Array<i32>,
    mask: &mut Array<i32>,
    err: &Array<f32>,
    fk: &Array<i32>,
    fr: &Array<i32>,
    bk: &Array<i32>,
    br: &Array<i32>,
    first_metric: &Array<i32>,
    metric: &mut Array<i32>,
    max_value: &Array<i32>,
    swaps: &mut Array<i32>,
    rows: u32,
    cols: u32,
    regrow_len: u32,
    regrow_whole: u32,
    m: u32,
    cycles: u32,
    threshold: f32,
    layout: u32,
) {
    let col = ABSOLUTE_POS;
    let c = cols as usize;
    let n = rows as usize;
    if col < c {
        let td = bit(layout, 0u32);
        copy_column(first, mask, n, c, col, bit(layout, 1u32));
        copy_column(first_metric, metric, n, c, col, bit(layout, 12u32));
        let rl = regrow_len as usize;
        let rx = regrow_whole == 0u32;
        let mm = m as usize;
        let mut e = err[col];
        let sign0 = sign_of(e);
        let raised = max_value[col];
        let mut g = regrow_start(rows);
        let mut active = true;
        let mut count = 0i32;
        for _ in 0..cycles {
            if active {
                let from_back = e > f32::new(0.0);
                let (rk, rr, r_has) =
                    regrow_next(&g, fk, fr, bk, br, rx, layout, rl, c, col, rows, from_back);
                let mut take = r_has && !(f32::abs(e) <= threshold);
                if take {
                    // The first smallest of the regrown weight's group.
                    let start = (rr as usize / mm) * mm;
                    let mut p = start;
                    let mut least = metric[start * c + col];
                    for j in start + 1..start + mm {
                        let v = metric[j * c + col];
                        if v < least {
                            least = v;
                            p = j;
                        }
                    }
                    let ra = rr as usize * c + col;
                    let pa = p * c + col;
                    let after = (e + d[at(p, col, n, c, td)]) - d[at(rr as usize, col, n, c, td)];
                    take = mask[ra] == 1i32 && mask[pa] == 0i32 && sign_of(after) == sign0;
                    if take {
                        mask[pa] = 1i32;
                        mask[ra] = 0i32;
                        metric[pa] = raised;
                        e = after;
                        count += 1i32;
                        advance(&mut g, from_back, rk, rr);
                    }
                }
                active = take;
            }
        }
        swaps[col] = count;
    }
}
