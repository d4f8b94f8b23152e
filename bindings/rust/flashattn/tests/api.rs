//! The safe API on the CPU backend: against a float64 reference, the cross-language reference file
//! written by bindings/common/make_reference.c (FLASHATTN_REFERENCE_FILE), errors and drop order.
use flashattn::*;

mod common;
use common::{score_row, Rng};

/// float64 reference on contiguous tensors; returns (O, LSE [b, hq, sq]).
fn reference(q: &[f32], k: &[f32], v: &[f32], s: &Shape, o: &Options) -> (Vec<f64>, Vec<f64>) {
    let (b, sq, sk, hq, hkv, dv) = (s.batch, s.seqlen_q, s.seqlen_k, s.heads_q, s.heads_kv, s.head_dim_v);
    let mut out = vec![0f64; s.o_len()];
    let mut lse = vec![f64::NEG_INFINITY; s.lse_len()];
    for bi in 0..b {
        for h in 0..hq {
            let hk = h / (hq / hkv);
            for i in 0..sq {
                let (scores, _) = score_row(q, k, s, o, bi, h, hk, i);
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                if m == f64::NEG_INFINITY {
                    continue;
                }
                let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
                lse[(bi * hq + h) * sq + i] = sum.ln() + m;
                for (j, sc) in scores.iter().enumerate() {
                    let p = (sc - m).exp() / sum;
                    for x in 0..dv {
                        out[((bi * sq + i) * hq + h) * dv + x] += p * v[((bi * sk + j) * hkv + hk) * dv + x] as f64;
                    }
                }
            }
        }
    }
    (out, lse)
}

fn assert_close(actual: impl Iterator<Item = f64>, expected: &[f64], atol: f64, rtol: f64, what: &str) {
    let mut n = 0;
    for (i, (a, e)) in actual.zip(expected).enumerate() {
        n += 1;
        if e.is_infinite() {
            assert_eq!(a, *e, "{what}[{i}]");
        } else {
            assert!((a - e).abs() <= atol + rtol * e.abs(), "{what}[{i}]: {a} vs {e}");
        }
    }
    assert_eq!(n, expected.len(), "{what}: length");
}

#[test]
fn causal_gqa_window_softcap_against_reference() {
    let mut rng = Rng(42);
    let shape = Shape { head_dim_v: 24, ..Shape::new(2, 19, 27, 4, 2, 16) };
    let (q, k, v) = (rng.vec(shape.q_len()), rng.vec(shape.k_len()), rng.vec(shape.v_len()));
    for opts in [
        Options::default(),
        Options { causal: true, ..Options::default() },
        Options { window: (5, 2), softcap: 3.0, scale: Some(0.4), ..Options::default() },
        Options { causal: true, window: (4, -1), ..Options::default() },
    ] {
        let out = attention(&q, &k, &v, &shape, &opts).unwrap();
        let (ro, rl) = reference(&q, &k, &v, &shape, &opts);
        assert_close(out.o.iter().map(|&x| x as f64), &ro, 2e-5, 2e-5, "O");
        assert_close(out.lse.iter().map(|&x| x as f64), &rl, 1e-4, 1e-5, "LSE");
    }
}

#[test]
fn half_precision_elements() {
    let mut rng = Rng(7);
    let shape = Shape::new(1, 16, 16, 2, 1, 32);
    let (q, k, v) = (rng.vec(shape.q_len()), rng.vec(shape.k_len()), rng.vec(shape.v_len()));
    let opts = Options { causal: true, ..Options::default() };
    let (ro, _) = reference(&q, &k, &v, &shape, &opts);
    let h = |x: &Vec<f32>| x.iter().map(|&f| F16::from_f32(f)).collect::<Vec<_>>();
    let out = attention(&h(&q), &h(&k), &h(&v), &shape, &opts).unwrap();
    assert_close(out.o.iter().map(|x| x.to_f32() as f64), &ro, 5e-3, 5e-3, "fp16 O");
    let b = |x: &Vec<f32>| x.iter().map(|&f| Bf16::from_f32(f)).collect::<Vec<_>>();
    let out = attention(&b(&q), &b(&k), &b(&v), &shape, &opts).unwrap();
    assert_close(out.o.iter().map(|x| x.to_f32() as f64), &ro, 3e-2, 3e-2, "bf16 O");
    for x in [0.0f32, 1.0, -2.5, 65504.0, 6.1e-5, 3.0e-7, 1e9] {
        let back = F16::from_f32(x).to_f32();
        assert!((back - x.min(f32::INFINITY)).abs() <= x.abs() * 1e-3 + 6e-8 || (x > 65520.0 && back.is_infinite()), "{x} -> {back}");
    }
}

#[test]
fn reproduces_c_api_reference_file() {
    let Some(path) = std::env::var_os("FLASHATTN_REFERENCE_FILE") else {
        eprintln!("FLASHATTN_REFERENCE_FILE is not set (CTest sets it): skipped");
        return;
    };
    let data = std::fs::read(&path).expect("reference file");
    assert_eq!(&data[..8], b"FAREF01\n");
    let mut pos = 8;
    let i64s = |pos: &mut usize| {
        let v = i64::from_le_bytes(data[*pos..*pos + 8].try_into().unwrap());
        *pos += 8;
        v
    };
    let ncases = i64s(&mut pos);
    assert!(ncases >= 3);
    for case in 0..ncases {
        let p: Vec<i64> = (0..16).map(|_| i64s(&mut pos)).collect();
        let softcap = f64::from_le_bytes(data[pos..pos + 8].try_into().unwrap());
        let scale = f64::from_le_bytes(data[pos + 8..pos + 16].try_into().unwrap());
        pos += 16;
        let (batch, sq, sk, hq, hkv, d, dv) = (p[0] as usize, p[1] as usize, p[2] as usize, p[3] as usize, p[4] as usize, p[5] as usize, p[6] as usize);
        let varlen = p[10] == 1;
        let opts = Options { causal: p[7] == 1, window: (p[8], p[9]), softcap, scale: (scale > 0.0).then_some(scale), backend: Backend::Cpu };
        let ints = |pos: &mut usize, n: usize| -> Vec<i32> {
            let v = (0..n).map(|i| i32::from_le_bytes(data[*pos + 4 * i..*pos + 4 * i + 4].try_into().unwrap())).collect();
            *pos += 4 * n;
            v
        };
        let floats = |pos: &mut usize, n: usize| -> Vec<f32> {
            let v = (0..n).map(|i| f32::from_le_bytes(data[*pos + 4 * i..*pos + 4 * i + 4].try_into().unwrap())).collect();
            *pos += 4 * n;
            v
        };
        let (cu_q, cu_k) = if varlen { (ints(&mut pos, batch + 1), ints(&mut pos, batch + 1)) } else { (vec![], vec![]) };
        let (rows_q, rows_k) = if varlen { (p[11] as usize, p[12] as usize) } else { (batch * sq, batch * sk) };
        let q = floats(&mut pos, rows_q * hq * d);
        let k = floats(&mut pos, rows_k * hkv * d);
        let v = floats(&mut pos, rows_k * hkv * dv);
        let o_ref = floats(&mut pos, rows_q * hq * dv);
        let lse_ref = floats(&mut pos, rows_q * hq);
        let out = if varlen {
            attention_varlen(&q, &k, &v, &cu_q, &cu_k, hq, hkv, d, dv, &opts).unwrap()
        } else {
            let shape = Shape { batch, seqlen_q: sq, seqlen_k: sk, heads_q: hq, heads_kv: hkv, head_dim: d, head_dim_v: dv };
            attention(&q, &k, &v, &shape, &opts).unwrap()
        };
        let o_ref: Vec<f64> = o_ref.iter().map(|&x| x as f64).collect();
        let lse_ref: Vec<f64> = lse_ref.iter().map(|&x| x as f64).collect();
        assert_close(out.o.iter().map(|&x| x as f64), &o_ref, 1e-6, 1e-5, &format!("case {case} O"));
        assert_close(out.lse.iter().map(|&x| x as f64), &lse_ref, 1e-6, 1e-6, &format!("case {case} LSE"));
    }
    assert_eq!(pos, data.len(), "trailing bytes");
}

#[test]
fn errors_carry_status_and_message() {
    let mut plan = Plan::new().unwrap();
    let err = plan.set_i64(I64Param::HeadDim, 12).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("multiple of 8"), "{}", err.message);
    assert!(err.to_string().starts_with("invalid argument: "));

    let err = plan.finalize().unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    assert!(err.message.contains("never set"));
    let err = plan.workspace_size().unwrap_err();
    assert_eq!(err.status, Status::InvalidState);

    let err = plan.set_f64(F64Param::SoftmaxScale, -1.0).unwrap_err();
    assert!(err.message.contains("> 0"), "{}", err.message);

    let shape = Shape::new(1, 4, 4, 3, 2, 8);
    let x = vec![0f32; 64];
    let err = attention(&x, &x, &x, &shape, &Options::default()).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("not a multiple"), "{}", err.message);
}

fn small_plan() -> Plan {
    let mut plan = Plan::with(&[(I64Param::Batch, 1), (I64Param::SeqlenQ, 8), (I64Param::SeqlenK, 8), (I64Param::HeadsQ, 2),
                                (I64Param::HeadDim, 8), (I64Param::Dtype, DType::Fp32.raw() as i64),
                                (I64Param::Backend, Backend::Cpu.raw() as i64)]).unwrap();
    plan.finalize().unwrap();
    plan
}

#[test]
fn host_slices_are_checked() {
    let plan = small_plan();
    let e = plan.extents().unwrap();
    assert_eq!(e.q, 8 * 2 * 8);
    let x = vec![0.5f32; e.q];
    let mut o = vec![0f32; e.o];
    plan.execute(&x, &x, &x, &mut o, None, None).unwrap();
    let err = plan.execute(&x[..10], &x, &x, &mut o, None, None).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("q: the slice holds 10"));
    let mut lse = vec![0f32; 3];
    assert!(plan.execute(&x, &x, &x, &mut o, Some(&mut lse), None).unwrap_err().message.contains("lse"));
    let h = vec![F16::default(); e.q];
    let mut oh = vec![F16::default(); e.o];
    assert!(plan.execute(&h, &h, &h, &mut oh, None, None).unwrap_err().message.contains("dtype"));
    let mut small = Workspace::new(16);
    let err = plan.execute(&x, &x, &x, &mut o, None, Some(&mut small)).unwrap_err();
    assert_eq!(err.status, Status::InsufficientWorkspace);
    // A fixed-length plan run through execute_varlen: the library says INVALID_STATE.
    let err = plan.execute_varlen(&x, &x, &x, &mut o, None, &[0, 8], &[0, 8], None).unwrap_err();
    assert_eq!(err.status, Status::InvalidState);
    assert!(err.message.contains("flashattn_plan_execute"), "{}", err.message);
}

#[test]
fn plans_dropped_in_any_order_and_across_threads() {
    let mut plans: Vec<Option<Plan>> = (0..32).map(|_| Some(small_plan())).collect();
    let mut order: Vec<usize> = (0..plans.len()).collect();
    let mut rng = Rng(3);
    for i in (1..order.len()).rev() {
        let j = ((rng.next() * 0.5 + 0.5) * (i as f32 + 1.0)) as usize % (i + 1);
        order.swap(i, j);
    }
    for i in order {
        plans[i] = None;
    }
    // moved to other threads and dropped there; a shared finalized plan executed concurrently
    let shared = small_plan();
    let x = vec![0.25f32; shared.extents().unwrap().q];
    std::thread::scope(|s| {
        for _ in 0..4 {
            let p = small_plan();
            s.spawn(move || drop(p));
            s.spawn(|| {
                let mut o = vec![0f32; x.len()];
                for _ in 0..10 {
                    shared.execute(&x, &x, &x, &mut o, None, None).unwrap();
                }
                assert!(o.iter().all(|&v| (v - 0.25).abs() < 1e-6));
            });
        }
    });
    drop(Plan::new().unwrap()); // never finalized
}

#[test]
fn info() {
    assert_eq!(version().0, 0);
    assert!(build_info().contains("backends=cpu"));
    assert!(device_count().unwrap() >= 0);
    assert_eq!(Status::InvalidArgument.name(), "invalid argument");
    let plan = small_plan();
    let (backend, reason) = plan.backend().unwrap();
    assert_eq!(backend, Backend::Cpu);
    assert!(!reason.is_empty());
    assert!((plan.get_f64(F64Param::SoftmaxScale).unwrap() - 8f64.sqrt().recip()).abs() < 1e-12);
}
