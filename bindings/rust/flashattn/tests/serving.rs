//! Plan::execute_args on the CPU backend: one decode step over a paged cache (page size 3, a
//! shuffled page table) that appends a row with a half-split rotary embedding, against a float64
//! reference that gathers the pages and rotates on its own; and a bad page index, which must fail
//! with nothing written.
use flashattn::*;
use std::ffi::c_void;
use std::ptr;

mod common;
use common::Rng;

const B: usize = 2;
const SK: usize = 10;
const HQ: usize = 2;
const D: usize = 8;
const PAGE: usize = 3;
const MAXP: usize = 4; // ceil(SK / PAGE)
const NPAGES: usize = 9;
const ROT: usize = 4;

fn plan() -> Plan {
    let mut p = Plan::with(&[
        (I64Param::Batch, B as i64), (I64Param::SeqlenQ, 1), (I64Param::SeqlenK, SK as i64),
        (I64Param::HeadsQ, HQ as i64), (I64Param::HeadsKv, 1), (I64Param::HeadDim, D as i64),
        (I64Param::Dtype, DType::Fp32.raw() as i64), (I64Param::Backend, Backend::Cpu.raw() as i64),
        (I64Param::PagedKv, 1), (I64Param::PageSize, PAGE as i64), (I64Param::NumPages, NPAGES as i64),
        (I64Param::SequsedK, 1), (I64Param::NewKvRows, 1), (I64Param::RotaryDim, ROT as i64),
    ]).unwrap();
    p.finalize().unwrap();
    p
}

/// x rotated at table row pos (pairs (i, i + ROT/2)), in f64.
fn rotate(x: &[f32], cos: &[f32], sin: &[f32], pos: usize) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for i in 0..ROT / 2 {
        let (c, s) = (cos[pos * ROT / 2 + i] as f64, sin[pos * ROT / 2 + i] as f64);
        let (a, b) = (x[i] as f64, x[i + ROT / 2] as f64);
        out[i] = a * c - b * s;
        out[i + ROT / 2] = a * s + b * c;
    }
    out
}

struct Case {
    q: Vec<f32>, k: Vec<f32>, v: Vec<f32>, k_new: Vec<f32>, v_new: Vec<f32>,
    table: Vec<i32>, seqused: Vec<i32>, cos: Vec<f32>, sin: Vec<f32>,
}

fn make_case() -> Case {
    let mut rng = Rng(42);
    let mut cos = vec![0f32; SK * ROT / 2];
    let mut sin = vec![0f32; SK * ROT / 2];
    for p in 0..SK {
        for i in 0..ROT / 2 {
            let theta = p as f64 * 10000f64.powf(-2.0 * i as f64 / ROT as f64);
            cos[p * ROT / 2 + i] = theta.cos() as f32;
            sin[p * ROT / 2 + i] = theta.sin() as f32;
        }
    }
    Case {
        q: rng.vec(B * HQ * D), k: rng.vec(NPAGES * PAGE * D), v: rng.vec(NPAGES * PAGE * D),
        k_new: rng.vec(B * D), v_new: rng.vec(B * D),
        table: vec![4, 0, 7, 2, 8, 1, 6, 3], seqused: vec![5, 0], cos, sin,
    }
}

fn slot(c: &Case, b: usize, t: usize) -> usize {
    (c.table[b * MAXP + t / PAGE] as usize * PAGE + t % PAGE) * D
}

fn run(p: &Plan, c: &mut Case, o: &mut [f32]) -> Result<()> {
    let mut args = Args::new()?;
    args.set(Arg::Q, c.q.as_ptr() as *const c_void)?
        .set(Arg::K, c.k.as_mut_ptr() as *const c_void)? // written: the caches take the new row
        .set(Arg::V, c.v.as_mut_ptr() as *const c_void)?
        .set(Arg::O, o.as_mut_ptr() as *const c_void)?
        .set(Arg::PageTable, c.table.as_ptr() as *const c_void)?
        .set(Arg::SequsedK, c.seqused.as_ptr() as *const c_void)?
        .set(Arg::KNew, c.k_new.as_ptr() as *const c_void)?
        .set(Arg::VNew, c.v_new.as_ptr() as *const c_void)?
        .set(Arg::RotaryCos, c.cos.as_ptr() as *const c_void)?
        .set(Arg::RotarySin, c.sin.as_ptr() as *const c_void)?;
    assert_eq!(args.get(Arg::PageTable)?, c.table.as_ptr() as *const c_void);
    assert!(args.get(Arg::Lse)?.is_null());
    let mut ws = p.workspace()?;
    let (ws_ptr, ws_len) = (ws.as_mut_ptr(), ws.len());
    unsafe { p.execute_args(&args, ws_ptr, ws_len, ptr::null_mut()) }
}

#[test]
fn decode_step_matches_the_reference() {
    let p = plan();
    let mut c = make_case();
    let before = c.clone_parts();
    let mut o = vec![f32::NAN; B * HQ * D];
    run(&p, &mut c, &mut o).unwrap();
    assert_eq!(c.seqused, vec![5, 0], "the library never writes seqused_k");
    let scale = 1.0 / (D as f64).sqrt();
    for b in 0..B {
        let used = before.1[b] as usize;
        let n = used + 1;
        let k_new = rotate(&c.k_new[b * D..(b + 1) * D], &c.cos, &c.sin, used);
        let mut keys: Vec<Vec<f64>> = (0..used).map(|t| before.0[slot(&c, b, t)..][..D].iter().map(|&x| x as f64).collect()).collect();
        keys.push(k_new.clone());
        let mut vals: Vec<Vec<f64>> = (0..used).map(|t| c.v[slot(&c, b, t)..][..D].iter().map(|&x| x as f64).collect()).collect();
        vals.push(c.v_new[b * D..(b + 1) * D].iter().map(|&x| x as f64).collect());
        // the cache holds the rotated row and V_new
        for x in 0..D {
            assert!((c.k[slot(&c, b, used) + x] as f64 - k_new[x]).abs() < 1e-6);
            assert_eq!(c.v[slot(&c, b, used) + x], c.v_new[b * D + x]);
        }
        for h in 0..HQ {
            let q = rotate(&c.q[(b * HQ + h) * D..][..D], &c.cos, &c.sin, used);
            let s: Vec<f64> = (0..n).map(|j| (0..D).map(|x| q[x] * keys[j][x]).sum::<f64>() * scale).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for x in 0..D {
                let r: f64 = (0..n).map(|j| (s[j] - m).exp() / sum * vals[j][x]).sum();
                let got = o[(b * HQ + h) * D + x] as f64;
                assert!((got - r).abs() < 2e-5, "O[{b}][{h}][{x}] = {got}, reference {r}");
            }
        }
    }
}

#[test]
fn bad_page_index_writes_nothing() {
    let p = plan();
    let mut c = make_case();
    c.table[1] = NPAGES as i32; // sequence 0 reads pages 0 and 1 (5 + 1 keys)
    let k_before = c.k.clone();
    let mut o = vec![7f32; B * HQ * D];
    let err = run(&p, &mut c, &mut o).unwrap_err();
    assert_eq!(err.status, Status::InvalidArgument);
    assert!(err.message.contains("page_table[0][1]"), "{}", err.message);
    assert!(o.iter().all(|&x| x == 7.0));
    assert_eq!(c.k, k_before);
}

impl Case {
    /// The K cache and seqused_k before the call.
    fn clone_parts(&self) -> (Vec<f32>, Vec<i32>) {
        (self.k.clone(), self.seqused.clone())
    }
}

// I64Param::NumSplits (since 0.3): 0..=128; before finalize what was set, after it the plan's
// count (the CPU backend has no split-KV: 1).
#[test]
fn num_splits_key() {
    let mut p = Plan::with(&[
        (I64Param::Batch, 1), (I64Param::SeqlenQ, 1), (I64Param::SeqlenK, 300), (I64Param::HeadsQ, 4),
        (I64Param::HeadsKv, 1), (I64Param::HeadDim, 16), (I64Param::Dtype, DType::Fp32.raw() as i64),
        (I64Param::Backend, Backend::Cpu.raw() as i64),
    ])
    .unwrap();
    assert_eq!(p.get_i64(I64Param::NumSplits).unwrap(), 0);
    for bad in [-1i64, 129] {
        let err = p.set_i64(I64Param::NumSplits, bad).err().unwrap();
        assert_eq!(err.status, Status::InvalidArgument);
        assert!(err.message.contains("FLASHATTN_I64_NUM_SPLITS"), "{}", err.message);
    }
    p.set_i64(I64Param::NumSplits, 7).unwrap();
    assert_eq!(p.get_i64(I64Param::NumSplits).unwrap(), 7);
    p.finalize().unwrap();
    assert_eq!(p.get_i64(I64Param::NumSplits).unwrap(), 1);
}
