//! The ggml wrapper computes what the math says, on pinned and unpinned pools, and refuses what
//! would make ggml abort.

use qtts::ffi::{Context, CoreLoan, GgmlError, Threadpool};
use qtts::gguf::GgmlType;

#[test]
fn mul_mat_add_silu_match_a_reference() {
    let (k, m, n) = (96, 40, 7);
    let a: Vec<f32> = (0..k * m)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 13 % 89) as f32 - 44.0) / 44.0)
        .collect();
    let bias: Vec<f32> = (0..m).map(|i| i as f32 / m as f32 - 0.5).collect();
    for pool in [
        Threadpool::new(1, &[]).unwrap(),
        Threadpool::new(2, &[0, 1]).unwrap(),
    ] {
        let ctx = Context::new(1 << 20).unwrap();
        let ta = ctx.new_f32(&[k, m]).unwrap();
        ta.write_f32(&a).unwrap();
        let tb = ctx.new_f32(&[k, n]).unwrap();
        tb.write_f32(&b).unwrap();
        let tbias = ctx.new_f32(&[m]).unwrap();
        tbias.write_f32(&bias).unwrap();
        let y = ctx.mul_mat(ta, tb).unwrap();
        let y = ctx.add(y, tbias).unwrap();
        let y = ctx.silu(y).unwrap();
        let mut g = ctx.graph(y).unwrap();
        g.compute(&pool).unwrap();
        g.compute(&pool).unwrap(); // reusable
        let got = y.to_vec();
        assert_eq!(y.ne(), [m, n, 1, 1]);
        for j in 0..n {
            for i in 0..m {
                let z: f64 = bias[i] as f64
                    + (0..k)
                        .map(|t| a[i * k + t] as f64 * b[j * k + t] as f64)
                        .sum::<f64>();
                let want = z / (1.0 + (-z).exp());
                assert!(
                    (got[j * m + i] as f64 - want).abs() < 1e-4,
                    "({i},{j}) {} vs {want}",
                    got[j * m + i]
                );
            }
        }
    }
}

/// A pool that borrows another stage's cores computes the same values on them as without them,
/// and uses them only while their owner holds no claim.
#[test]
fn a_borrowing_pool_uses_the_lent_cores_only_between_claims() {
    let (k, m, n) = (256, 64, 3);
    let a: Vec<f32> = (0..k * m)
        .map(|i| (i * 31 % 97) as f32 / 97.0 - 0.5)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| (i * 17 % 83) as f32 / 83.0 - 0.5)
        .collect();
    let loan = CoreLoan::new();
    let pool = Threadpool::new(1, &[])
        .unwrap()
        .borrowing(Threadpool::new(2, &[]).unwrap(), loan.clone());
    let ctx = Context::new(1 << 20).unwrap();
    let ta = ctx.new_f32(&[k, m]).unwrap();
    ta.write_f32(&a).unwrap();
    let tb = ctx.new_f32(&[k, n]).unwrap();
    tb.write_f32(&b).unwrap();
    let y = ctx.mul_mat(ta, tb).unwrap();
    let mut g = ctx.graph(y).unwrap();

    g.compute(&pool).unwrap();
    let lent = y.to_vec();
    assert_eq!(loan.counts(), (1, 0), "unclaimed: on the lent cores");
    {
        let _claim = loan.claim();
        g.compute(&pool).unwrap();
        assert_eq!(loan.counts(), (1, 1), "claimed: on the pool's own");
    }
    let own = y.to_vec();
    g.compute(&pool).unwrap();
    assert_eq!(loan.counts(), (2, 1), "the claim's end lends them again");
    // ggml splits a product by rows: the thread count does not change a value.
    assert_eq!(lent, own);
    for j in 0..n {
        for i in 0..m {
            let want: f64 = (0..k)
                .map(|t| a[i * k + t] as f64 * b[j * k + t] as f64)
                .sum();
            assert!((lent[j * m + i] as f64 - want).abs() < 1e-4);
        }
    }
}

#[test]
fn misuse_is_an_error_not_an_abort() {
    let ctx = Context::new(1 << 16).unwrap();
    let a = ctx.new_f32(&[8, 4]).unwrap();
    let b = ctx.new_f32(&[9, 4]).unwrap();
    assert!(matches!(
        ctx.mul_mat(a, b),
        Err(GgmlError::Shape {
            what: "mul_mat",
            ..
        })
    ));
    assert!(matches!(
        ctx.add(a, b),
        Err(GgmlError::Shape { what: "add", .. })
    ));
    assert!(matches!(
        a.write_f32(&[0.0; 3]),
        Err(GgmlError::Shape { .. })
    ));
    // A context that is full refuses instead of letting ggml abort.
    assert!(matches!(
        ctx.new_f32(&[1 << 20]),
        Err(GgmlError::Alloc { .. })
    ));
    assert!(matches!(ctx.new_f32(&[0]), Err(GgmlError::Shape { .. })));
    assert!(matches!(
        Threadpool::new(0, &[]),
        Err(GgmlError::Threadpool { .. })
    ));
    assert!(matches!(
        Threadpool::new(1, &[600]),
        Err(GgmlError::Threadpool { .. })
    ));
}

#[test]
fn aligned_tensors_start_on_their_alignment_and_hold_their_bytes() {
    let ctx = Context::new(1 << 20).unwrap();
    // Tensors of odd sizes between them, so that ggml's own placement (at 16 bytes) drifts.
    for (i, ne) in [[96usize, 64], [32, 3], [160, 32], [64, 1]]
        .into_iter()
        .enumerate()
    {
        ctx.new_tensor(GgmlType::F32, &[5 + 3 * i]).unwrap();
        for (ty, es) in [(GgmlType::BF16, 2), (GgmlType::F32, 4)] {
            let t = ctx.new_tensor_aligned(ty, &ne, 64).unwrap();
            assert_eq!(t.data_address() % 64, 0, "{ne:?} {ty}");
            assert_eq!(t.ne(), [ne[0], ne[1], 1, 1]);
            assert_eq!(t.nbytes(), ne[0] * ne[1] * es);
            let bytes: Vec<u8> = (0..t.nbytes()).map(|j| (j * 31 + i) as u8).collect();
            t.write_bytes(&bytes).unwrap();
            assert_eq!(t.read_bytes().unwrap(), bytes);
        }
    }
    for (ty, align) in [
        (GgmlType::Q8_0, 64),
        (GgmlType::BF16, 48),
        (GgmlType::BF16, 0),
    ] {
        assert!(
            matches!(
                ctx.new_tensor_aligned(ty, &[64, 2], align),
                Err(GgmlError::Shape {
                    what: "aligned tensor",
                    ..
                })
            ),
            "{ty} at {align}"
        );
    }
    let views = Context::unallocated(4).unwrap();
    assert!(matches!(
        views.new_tensor_aligned(GgmlType::BF16, &[64, 2], 64),
        Err(GgmlError::Shape {
            what: "aligned tensor",
            ..
        })
    ));
}

/// Flash attention over caches of one position a row equals softmax attention computed here in
/// f64, within the caches' rounding (f16, whose values ggml's kernel also sums in f16, and q8_0,
/// whose queries it rounds to q8_0 too); masked keys do not count, and the query heads share
/// key heads in order (`n_head / n_head_kv` consecutive heads a key head).
#[test]
fn flash_attention_over_caches_matches_softmax_attention() {
    let (hd, nh, nkv, n_ctx, rows, n_kv) = (64, 4, 2, 40, 3, 24);
    let val = |i: usize, s: usize| ((i * s % 97) as f32 - 48.0) / 48.0;
    let q: Vec<f32> = (0..hd * nh * rows).map(|i| val(i, 7)).collect();
    let k: Vec<f32> = (0..hd * nkv * n_ctx).map(|i| val(i, 13)).collect();
    let v: Vec<f32> = (0..hd * nkv * n_ctx).map(|i| val(i, 29)).collect();
    // Row r sees keys 0..=10 + 5r; keys past n_kv are never attended.
    let sees = |r: usize, t: usize| t <= 10 + 5 * r;
    let mut want = vec![0f64; hd * nh * rows];
    for r in 0..rows {
        for h in 0..nh {
            let g = h / (nh / nkv);
            let score = |t: usize| {
                (0..hd)
                    .map(|i| q[(r * nh + h) * hd + i] as f64 * k[(t * nkv + g) * hd + i] as f64)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            };
            let seen: Vec<usize> = (0..n_kv).filter(|&t| sees(r, t)).collect();
            let max = seen.iter().map(|&t| score(t)).fold(f64::MIN, f64::max);
            let w: Vec<f64> = seen.iter().map(|&t| (score(t) - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for (&t, wt) in seen.iter().zip(&w) {
                for i in 0..hd {
                    want[(r * nh + h) * hd + i] += wt / sum * v[(t * nkv + g) * hd + i] as f64;
                }
            }
        }
    }
    let mask: Vec<u8> = (0..rows)
        .flat_map(|r| (0..n_kv).map(move |t| if sees(r, t) { 0u16 } else { 0xfc00 }))
        .flat_map(u16::to_le_bytes)
        .collect();
    let pool = Threadpool::new(2, &[]).unwrap();
    for (ty, tol) in [(GgmlType::F16, 5e-3), (GgmlType::Q8_0, 2e-2)] {
        let ctx = Context::new(1 << 22).unwrap();
        let tq = ctx.new_f32(&[hd, nh, rows]).unwrap();
        tq.write_f32(&q).unwrap();
        let caches = [&k, &v].map(|x| {
            let t = ctx.new_tensor(ty, &[hd * nkv, n_ctx]).unwrap();
            let bytes = qtts::ffi::quantize(ty, x, hd * nkv).unwrap();
            t.write_bytes(&bytes).unwrap();
            t
        });
        let tm = ctx.new_tensor(GgmlType::F16, &[n_kv, rows]).unwrap();
        tm.write_bytes(&mask).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let o = ctx
            .flash_attn_cache(tq, caches[0], caches[1], n_kv, nkv, tm, scale)
            .unwrap();
        assert_eq!(o.ne(), [hd * nh, rows, 1, 1]);
        ctx.graph(o).unwrap().compute(&pool).unwrap();
        let got = o.to_vec();
        let err = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0f64, f64::max);
        assert!(err < tol, "{ty}: max error {err}");
        // Misuse is refused: a mask of the wrong length, caches of another width.
        let short = ctx.new_tensor(GgmlType::F16, &[n_kv - 1, rows]).unwrap();
        assert!(matches!(
            ctx.flash_attn_cache(tq, caches[0], caches[1], n_kv, nkv, short, scale),
            Err(GgmlError::Shape {
                what: "flash attention",
                ..
            })
        ));
        assert!(matches!(
            ctx.flash_attn_cache(tq, caches[0], caches[1], n_kv, 1, tm, scale),
            Err(GgmlError::Shape {
                what: "flash attention",
                ..
            })
        ));
    }
}

/// One row's attention over q8_0 caches in one node (`attend_q8_row`) equals softmax attention
/// computed here in f64 on the caches' own (dequantized) values and the queries rounded to q8_0,
/// to float rounding: positions
/// past the row's are not read, and a position past the cache is clamped to its end.
#[test]
fn one_row_attention_over_q8_0_caches_matches_softmax_attention() {
    let (hd, nh, nkv, n_ctx) = (64, 4, 2, 40);
    let val = |i: usize, s: usize| ((i * s % 97) as f32 - 48.0) / 48.0;
    let q: Vec<f32> = (0..hd * nh).map(|i| val(i, 7)).collect();
    let [k, v] = [13, 29].map(|s| {
        let x: Vec<f32> = (0..hd * nkv * n_ctx).map(|i| val(i, s)).collect();
        qtts::ffi::quantize(GgmlType::Q8_0, &x, hd * nkv).unwrap()
    });
    let [kd, vd] = [&k, &v].map(|b| qtts::ffi::dequantize(GgmlType::Q8_0, b, hd * nkv * n_ctx));
    let [kd, vd] = [kd.unwrap(), vd.unwrap()];
    // The kernel rounds the queries to q8_0, as ggml's flash attention does.
    let q8 = qtts::ffi::quantize(GgmlType::Q8_0, &q, hd).unwrap();
    let qr = qtts::ffi::dequantize(GgmlType::Q8_0, &q8, hd * nh).unwrap();
    let pool = Threadpool::new(2, &[]).unwrap();
    for (pos, seen) in [(0, 1), (17, 18), (39, 40), (90, 40)] {
        let mut want = vec![0f64; hd * nh];
        for h in 0..nh {
            let g = h / (nh / nkv);
            let score = |t: usize| {
                (0..hd)
                    .map(|i| qr[h * hd + i] as f64 * kd[(t * nkv + g) * hd + i] as f64)
                    .sum::<f64>()
                    / (hd as f64).sqrt()
            };
            let max = (0..seen).map(score).fold(f64::MIN, f64::max);
            let w: Vec<f64> = (0..seen).map(|t| (score(t) - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for (t, wt) in w.iter().enumerate() {
                for i in 0..hd {
                    want[h * hd + i] += wt / sum * vd[(t * nkv + g) * hd + i] as f64;
                }
            }
        }
        let ctx = Context::new(1 << 20).unwrap();
        let tq = ctx.new_f32(&[hd, nh, 1]).unwrap();
        tq.write_f32(&q).unwrap();
        let [tk, tv] = [&k, &v].map(|b| {
            let t = ctx.new_tensor(GgmlType::Q8_0, &[hd * nkv, n_ctx]).unwrap();
            t.write_bytes(b).unwrap();
            t
        });
        let tp = ctx.new_i32(1).unwrap();
        tp.write_i32(&[pos]).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let o = ctx.attend_q8_row(tq, tk, tv, tp, nkv, scale).unwrap();
        ctx.graph(o).unwrap().compute(&pool).unwrap();
        let err = o
            .to_vec()
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0f64, f64::max);
        assert!(err < 1e-5, "position {pos}: max error {err}");
        // Misuse is refused: f32 caches, a key head count that does not divide the width.
        let f = ctx.new_f32(&[hd * nkv, n_ctx]).unwrap();
        for (kk, vv, kv) in [(f, f, nkv), (tk, tv, 3)] {
            assert!(matches!(
                ctx.attend_q8_row(tq, kk, vv, tp, kv, scale),
                Err(GgmlError::Shape {
                    what: "attend_q8_row",
                    ..
                })
            ));
        }
    }
}

/// A graph holds the contexts it reads: it computes the same after its builder dropped its own
/// handle to the weights, and a graph that reads a context it was not given is refused.
#[test]
fn an_owned_graph_holds_what_it_reads_and_reads_nothing_else() {
    use qtts::ffi::{OwnedGraph, SharedContext, Tensor};
    let pool = Threadpool::new(1, &[]).unwrap();
    let weights = SharedContext::new(Context::new(1 << 16).unwrap());
    let w = weights.new_f32(&[4, 2]).unwrap().set_name("w");
    w.write_f32(&[1.0, 2.0, 3.0, 4.0, -1.0, -2.0, -3.0, -4.0])
        .unwrap();
    let mut g = OwnedGraph::build(1 << 20, &[&weights], |c| {
        let x = c.new_f32(&[4, 1])?.set_name("in.x");
        Ok(vec![c
            .mul_mat(weights.get("w").unwrap(), x)?
            .set_name("out.y")
            .node()])
    })
    .unwrap();
    drop(weights);
    g.tensor("in.x")
        .unwrap()
        .write_f32(&[1.0, 1.0, 1.0, 1.0])
        .unwrap();
    g.compute(&pool).unwrap();
    let y: Tensor<'_> = g.tensor("out.y").unwrap();
    assert_eq!(y.to_vec(), vec![10.0, -10.0]);

    // The same graph over a context it is not given: refused, naming the tensor.
    let other = Context::new(1 << 16).unwrap();
    let w = other.new_f32(&[4, 2]).unwrap().set_name("foreign");
    let err = OwnedGraph::build(1 << 20, &[], |c| {
        let x = c.new_f32(&[4, 1])?.set_name("in.x");
        Ok(vec![c.mul_mat(w, x)?.node()])
    })
    .unwrap_err();
    assert!(
        matches!(&err, GgmlError::Shape { found, .. } if found.contains("foreign")),
        "{err}"
    );
}
