//! The backward pass on the CPU backend: dQ, dK, dV against a float64 loop reference (fixed and
//! variable length), strided gradients, and its errors.
use flashattn::*;

mod common;
use common::{score_row, Rng};

/// float64 gradients of sum(O * dout) on contiguous tensors: (dQ, dK, dV).
/// P = softmax(S); dS = P (dO·V - dO·O) through the softcap's tanh; dQ = scale dS K,
/// dK = scale dSᵀ Q, dV = Pᵀ dO, dK and dV summed over each kv head's query group.
fn reference_backward(q: &[f32], k: &[f32], v: &[f32], dout: &[f32], s: &Shape, o: &Options)
                      -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (b, sq, sk, hq, hkv, d, dv) = (s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim, s.head_dim_v);
    let scale = common::scale(s, o);
    let (mut dq, mut dk, mut dvv) = (vec![0f64; s.q_len()], vec![0f64; s.k_len()], vec![0f64; s.v_len()]);
    for bi in 0..b {
        for h in 0..hq {
            let hk = h / (hq / hkv);
            let qi = |i: usize, x: usize| q[((bi * sq + i) * hq + h) * d + x] as f64;
            let ki = |j: usize, x: usize| k[((bi * sk + j) * hkv + hk) * d + x] as f64;
            let vi = |j: usize, x: usize| v[((bi * sk + j) * hkv + hk) * dv + x] as f64;
            let di = |i: usize, x: usize| dout[((bi * sq + i) * hq + h) * dv + x] as f64;
            for i in 0..sq {
                let (scores, tanhs) = score_row(q, k, s, o, bi, h, hk, i);
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue; // sees no key: no gradient flows
                }
                let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = scores.iter().map(|x| (x - m).exp() / sum).collect();
                let out: Vec<f64> = (0..dv).map(|x| (0..sk).map(|j| p[j] * vi(j, x)).sum()).collect();
                let delta: f64 = (0..dv).map(|x| di(i, x) * out[x]).sum();
                for j in 0..sk {
                    if p[j] == 0.0 {
                        continue;
                    }
                    let dp: f64 = (0..dv).map(|x| di(i, x) * vi(j, x)).sum();
                    let mut ds = p[j] * (dp - delta);
                    if o.softcap > 0.0 {
                        ds *= 1.0 - tanhs[j] * tanhs[j];
                    }
                    for x in 0..d {
                        dq[((bi * sq + i) * hq + h) * d + x] += scale * ds * ki(j, x);
                        dk[((bi * sk + j) * hkv + hk) * d + x] += scale * ds * qi(i, x);
                    }
                    for x in 0..dv {
                        dvv[((bi * sk + j) * hkv + hk) * dv + x] += p[j] * di(i, x);
                    }
                }
            }
        }
    }
    (dq, dk, dvv)
}

fn assert_close(actual: &[f32], expected: &[f64], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        assert!((a as f64 - e).abs() <= 1e-4 + 1e-4 * e.abs(), "{what}[{i}]: {a} vs {e}");
    }
}

/// Finite differences of sum(O * dout) through the library's forward agree with the reference
/// (checks the reference itself on a few entries; fp32 forward, so a loose tolerance).
#[test]
fn reference_is_the_gradient() {
    let mut rng = Rng(11);
    let shape = Shape::new(1, 4, 5, 2, 1, 8);
    let opts = Options { causal: true, softcap: 2.0, ..Options::default() };
    let (q, k, v, dout) = (rng.vec(shape.q_len()), rng.vec(shape.k_len()), rng.vec(shape.v_len()), rng.vec(shape.o_len()));
    let (rq, rk, _) = reference_backward(&q, &k, &v, &dout, &shape, &opts);
    let loss = |q: &[f32], k: &[f32]| -> f64 {
        let out = attention(q, k, &v, &shape, &opts).unwrap();
        out.o.iter().zip(&dout).map(|(&a, &b)| a as f64 * b as f64).sum()
    };
    let eps = 1e-2f32;
    for idx in [0, 9, 31, 63] {
        let (mut up, mut down) = (q.clone(), q.clone());
        up[idx] += eps;
        down[idx] -= eps;
        let fd = (loss(&up, &k) - loss(&down, &k)) / (2.0 * eps as f64);
        assert!((fd - rq[idx]).abs() < 2e-3, "dQ[{idx}]: {fd} vs {}", rq[idx]);
        let (mut up, mut down) = (k.clone(), k.clone());
        up[idx % k.len()] += eps;
        down[idx % k.len()] -= eps;
        let fd = (loss(&q, &up) - loss(&q, &down)) / (2.0 * eps as f64);
        assert!((fd - rk[idx % k.len()]).abs() < 2e-3, "dK[{idx}]: {fd} vs {}", rk[idx % k.len()]);
    }
}

#[test]
fn gradients_against_reference() {
    let mut rng = Rng(5);
    for (shape, opts) in [
        (Shape::new(2, 9, 13, 4, 2, 16), Options::default()),
        (Shape::new(2, 13, 7, 2, 2, 16), Options { causal: true, ..Options::default() }),
        (Shape { head_dim_v: 24, ..Shape::new(1, 11, 17, 6, 1, 16) },
         Options { window: (4, 2), softcap: 2.0, scale: Some(0.4), ..Options::default() }),
    ] {
        let (q, k, v) = (rng.vec(shape.q_len()), rng.vec(shape.k_len()), rng.vec(shape.v_len()));
        let dout = rng.vec(shape.o_len());
        let out = attention(&q, &k, &v, &shape, &opts).unwrap();
        let g = attention_backward(&q, &k, &v, &out, &dout, &shape, &opts).unwrap();
        let (rq, rk, rv) = reference_backward(&q, &k, &v, &dout, &shape, &opts);
        assert_close(&g.dq, &rq, "dQ");
        assert_close(&g.dk, &rk, "dK");
        assert_close(&g.dv, &rv, "dV");
    }
}

fn plan_for(shape: &Shape, extra: &[(I64Param, i64)]) -> Plan {
    let mut plan = Plan::with(&[
        (I64Param::Batch, shape.batch as i64), (I64Param::SeqlenQ, shape.seqlen_q as i64),
        (I64Param::SeqlenK, shape.seqlen_k as i64), (I64Param::HeadsQ, shape.heads_q as i64),
        (I64Param::HeadsKv, shape.heads_kv as i64), (I64Param::HeadDim, shape.head_dim as i64),
        (I64Param::HeadDimV, shape.head_dim_v as i64), (I64Param::Dtype, DType::Fp32.raw() as i64),
        (I64Param::Backend, Backend::Cpu.raw() as i64), (I64Param::Causal, 1),
    ]).unwrap();
    for &(key, value) in extra {
        plan.set_i64(key, value).unwrap();
    }
    plan.finalize().unwrap();
    plan
}

#[test]
fn strided_gradients_deterministic() {
    // dQ interleaved with another tensor of the same shape: head stride 2*d; DETERMINISTIC = 1.
    let mut rng = Rng(8);
    let shape = Shape::new(2, 7, 10, 4, 2, 16);
    let d = shape.head_dim as i64;
    let plan = plan_for(&shape, &[(I64Param::DqHeadStride, 2 * d), (I64Param::DqRowStride, 4 * 2 * d),
                                  (I64Param::DqBatchStride, 7 * 4 * 2 * d), (I64Param::Deterministic, 1)]);
    assert_eq!(plan.get_i64(I64Param::Deterministic).unwrap(), 1);
    assert_eq!(plan.extents().unwrap().dq, shape.q_len() * 2 - 16);
    let (backend, reason) = plan.backward_backend().unwrap();
    assert_eq!(backend, Backend::Cpu);
    assert!(!reason.is_empty());
    let (q, k, v, dout) = (rng.vec(shape.q_len()), rng.vec(shape.k_len()), rng.vec(shape.v_len()), rng.vec(shape.o_len()));
    let (mut o, mut lse) = (vec![0f32; shape.o_len()], vec![0f32; shape.lse_len()]);
    plan.execute(&q, &k, &v, &mut o, Some(&mut lse), None).unwrap();
    let mut dq = vec![7f32; shape.q_len() * 2];
    let (mut dk, mut dv) = (vec![0f32; shape.k_len()], vec![0f32; shape.v_len()]);
    let mut ws = plan.backward_workspace().unwrap();
    assert_eq!(ws.len(), plan.backward_workspace_size().unwrap());
    plan.backward(&q, &k, &v, &o, &dout, &lse, &mut dq, &mut dk, &mut dv, Some(&mut ws)).unwrap();
    let first = (dq.clone(), dk.clone(), dv.clone());
    plan.backward(&q, &k, &v, &o, &dout, &lse, &mut dq, &mut dk, &mut dv, None).unwrap();
    assert!(first == (dq.clone(), dk.clone(), dv.clone()), "two deterministic runs differ");
    let opts = Options { causal: true, ..Options::default() };
    let (rq, rk, rv) = reference_backward(&q, &k, &v, &dout, &shape, &opts);
    let dq_view: Vec<f32> = dq.chunks(16).step_by(2).flatten().cloned().collect();
    assert!(dq.chunks(16).skip(1).step_by(2).flatten().all(|&x| x == 7.0), "wrote outside dQ's view");
    assert_close(&dq_view, &rq, "dQ");
    assert_close(&dk, &rk, "dK");
    assert_close(&dv, &rv, "dV");
}

#[test]
fn varlen_gradients() {
    let mut rng = Rng(9);
    let (cu_q, cu_k) = ([0i32, 5, 12, 15], [0i32, 7, 7, 16]); // the second sequence has no keys
    let (hq, hkv, d) = (4usize, 2usize, 16usize);
    let (tq, tk) = (15usize, 16usize);
    let (q, k, v, dout) = (rng.vec(tq * hq * d), rng.vec(tk * hkv * d), rng.vec(tk * hkv * d), rng.vec(tq * hq * d));
    let opts = Options { causal: true, ..Options::default() };
    let out = attention_varlen(&q, &k, &v, &cu_q, &cu_k, hq, hkv, d, d, &opts).unwrap();
    let mut plan = Plan::with(&[
        (I64Param::Batch, 3), (I64Param::SeqlenQ, 7), (I64Param::SeqlenK, 9), (I64Param::HeadsQ, hq as i64),
        (I64Param::HeadsKv, hkv as i64), (I64Param::HeadDim, d as i64), (I64Param::Varlen, 1),
        (I64Param::TotalQ, tq as i64), (I64Param::TotalK, tk as i64), (I64Param::Causal, 1),
        (I64Param::Dtype, DType::Fp32.raw() as i64), (I64Param::Backend, Backend::Cpu.raw() as i64),
    ]).unwrap();
    plan.finalize().unwrap();
    let (mut dq, mut dk, mut dv) = (vec![f32::NAN; q.len()], vec![f32::NAN; k.len()], vec![f32::NAN; v.len()]);
    plan.backward_varlen(&q, &k, &v, &out.o, &dout, &out.lse, &mut dq, &mut dk, &mut dv, &cu_q, &cu_k, None).unwrap();
    let (mut rq, mut rk, mut rv) = (vec![0f64; q.len()], vec![0f64; k.len()], vec![0f64; v.len()]);
    for s in 0..3 {
        let (q0, q1, k0, k1) = (cu_q[s] as usize, cu_q[s + 1] as usize, cu_k[s] as usize, cu_k[s + 1] as usize);
        if k1 == k0 {
            continue;
        }
        let shape = Shape::new(1, q1 - q0, k1 - k0, hq, hkv, d);
        let (a, b, c) = reference_backward(&q[q0 * hq * d..q1 * hq * d], &k[k0 * hkv * d..k1 * hkv * d],
                                           &v[k0 * hkv * d..k1 * hkv * d], &dout[q0 * hq * d..q1 * hq * d], &shape, &opts);
        rq[q0 * hq * d..q1 * hq * d].copy_from_slice(&a);
        rk[k0 * hkv * d..k1 * hkv * d].copy_from_slice(&b);
        rv[k0 * hkv * d..k1 * hkv * d].copy_from_slice(&c);
    }
    assert_close(&dq, &rq, "dQ");
    assert_close(&dk, &rk, "dK");
    assert_close(&dv, &rv, "dV");
    assert!(dq[5 * hq * d..12 * hq * d].iter().all(|&x| x == 0.0), "dQ of the sequence without keys");
}

#[test]
fn backward_errors() {
    let mut plan = Plan::with(&[(I64Param::Batch, 1), (I64Param::SeqlenQ, 8), (I64Param::SeqlenK, 8), (I64Param::HeadsQ, 2),
                                (I64Param::HeadDim, 8), (I64Param::Dtype, DType::Fp32.raw() as i64),
                                (I64Param::Backend, Backend::Cpu.raw() as i64)]).unwrap();
    let err = plan.backward_workspace_size().unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    assert!(!err.message.is_empty());
    assert_eq!(plan.backward_backend().unwrap_err().status, Status::InvalidState);
    plan.finalize().unwrap();
    let x = vec![0.5f32; 128];
    let lse = vec![0f32; 16];
    let (mut dq, mut dk, mut dv) = (vec![0f32; 128], vec![0f32; 128], vec![0f32; 128]);
    let need = plan.backward_workspace_size().unwrap();
    if need > 0 {
        let mut small = Workspace::new(need - 1);
        let err = plan.backward(&x, &x, &x, &x, &x, &lse, &mut dq, &mut dk, &mut dv, Some(&mut small)).unwrap_err();
        assert_eq!(err.status, Status::InsufficientWorkspace);
        assert!(!err.message.is_empty());
    }
    let err = plan.backward(&x, &x, &x, &x, &x, &lse, &mut dq[..100], &mut dk, &mut dv, None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("dq: the slice holds 100"), "{}", err.message);
    let err = plan.backward(&x, &x, &x, &x, &x, &lse[..3], &mut dq, &mut dk, &mut dv, None).unwrap_err();
    assert!(err.message.contains("lse"), "{}", err.message);
    let err = plan.backward_varlen(&x, &x, &x, &x, &x, &lse, &mut dq, &mut dk, &mut dv, &[0, 8], &[0, 8], None)
        .unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
}
