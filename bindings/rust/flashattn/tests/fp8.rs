//! FP8 (E4M3) inputs through Plan::execute_args on the CPU backend (since 0.3): E4M3 bytes with
//! per-(sequence, key/value head) descales, O in bf16, against a float64 reference that decodes
//! E4M3 here from its definition; a missing descale must be refused naming it.
use flashattn::*;
use std::ffi::c_void;
use std::ptr;

const B: usize = 2;
const S: usize = 6;
const HQ: usize = 2;
const HK: usize = 1;
const D: usize = 16;

fn e4m3(b: u8) -> f64 {
    let (e, m) = (((b >> 3) & 15) as i32, (b & 7) as f64);
    let v = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    if b & 0x80 != 0 { -v } else { v }
}

#[test]
fn fp8_forward_matches_the_reference() {
    let mut p = Plan::with(&[
        (I64Param::Batch, B as i64), (I64Param::SeqlenQ, S as i64), (I64Param::SeqlenK, S as i64),
        (I64Param::HeadsQ, HQ as i64), (I64Param::HeadsKv, HK as i64), (I64Param::HeadDim, D as i64),
        (I64Param::Dtype, DType::Fp8E4m3.raw() as i64), (I64Param::Backend, Backend::Cpu.raw() as i64),
    ])
    .unwrap();
    p.finalize().unwrap();
    assert_eq!(p.get_i64(I64Param::OutputDtype).unwrap(), DType::Bf16.raw() as i64);
    let mut x: u32 = 99;
    let mut next = || {
        x = x.wrapping_mul(1664525).wrapping_add(1013904223);
        ((x >> 24) as u8) & 0xbf // finite, below 2
    };
    let q: Vec<u8> = (0..B * S * HQ * D).map(|_| next()).collect();
    let k: Vec<u8> = (0..B * S * HK * D).map(|_| next()).collect();
    let v: Vec<u8> = (0..B * S * HK * D).map(|_| next()).collect();
    let (dq, dk, dv) = ([0.5f32, 1.5], [1.25f32, 0.75], [2.0f32, 0.5]);
    let mut o = vec![0xffffu16; B * S * HQ * D];
    let mut args = Args::new().unwrap();
    args.set(Arg::Q, q.as_ptr() as *const c_void).unwrap()
        .set(Arg::K, k.as_ptr() as *const c_void).unwrap()
        .set(Arg::V, v.as_ptr() as *const c_void).unwrap()
        .set(Arg::O, o.as_mut_ptr() as *const c_void).unwrap()
        .set(Arg::DescaleQ, dq.as_ptr() as *const c_void).unwrap()
        .set(Arg::DescaleK, dk.as_ptr() as *const c_void).unwrap()
        .set(Arg::DescaleV, dv.as_ptr() as *const c_void).unwrap();
    let mut ws = p.workspace().unwrap();
    let (ws_ptr, ws_len) = (ws.as_mut_ptr(), ws.len());
    unsafe { p.execute_args(&args, ws_ptr, ws_len, ptr::null_mut()) }.unwrap();
    for b in 0..B {
        for h in 0..HQ {
            for i in 0..S {
                let s: Vec<f64> = (0..S)
                    .map(|j| {
                        (0..D).map(|c| e4m3(q[((b * S + i) * HQ + h) * D + c]) * dq[b] as f64
                            * e4m3(k[(b * S + j) * D + c]) * dk[b] as f64).sum::<f64>() / (D as f64).sqrt()
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let den: f64 = s.iter().map(|x| (x - m).exp()).sum();
                for c in 0..D {
                    let want: f64 = (0..S).map(|j| (s[j] - m).exp() * e4m3(v[(b * S + j) * D + c]) * dv[b] as f64)
                        .sum::<f64>() / den;
                    let got = f32::from_bits((o[((b * S + i) * HQ + h) * D + c] as u32) << 16) as f64;
                    assert!((got - want).abs() <= want.abs() / 256.0 + 1e-5 * (1.0 + want.abs()),
                            "O[{b},{i},{h},{c}] = {got}, want {want}");
                }
            }
        }
    }
    args.set(Arg::DescaleK, ptr::null()).unwrap();
    let err = unsafe { p.execute_args(&args, ws_ptr, ws_len, ptr::null_mut()) }.unwrap_err();
    assert!(err.message.contains("descale_k"), "{}", err);
}

#[test]
fn rotate_hadamard_keeps_scores() {
    const N: usize = 5;
    const DIM: usize = 32;
    let q: Vec<f32> = (0..N * DIM).map(|i| ((i * 7 % 13) as f32 - 6.0) / 3.0).collect();
    let k: Vec<f32> = (0..N * DIM).map(|i| ((i * 5 % 11) as f32 - 5.0) / 2.0).collect();
    let (mut qr, mut kr) = (q.clone(), k.clone());
    rotate_hadamard(&mut qr, DIM, 9).unwrap();
    rotate_hadamard(&mut kr, DIM, 9).unwrap();
    assert_ne!(q, qr);
    for i in 0..N {
        for j in 0..N {
            let s: f64 = (0..DIM).map(|c| q[i * DIM + c] as f64 * k[j * DIM + c] as f64).sum();
            let sr: f64 = (0..DIM).map(|c| qr[i * DIM + c] as f64 * kr[j * DIM + c] as f64).sum();
            assert!((s - sr).abs() <= 1e-4 * (1.0 + s.abs()), "score ({i},{j}): {s} vs {sr}");
        }
    }
    let err = rotate_hadamard(&mut vec![0f32; 96], 96, 1).unwrap_err();
    assert!(err.message.contains("dim"), "{}", err);
}
