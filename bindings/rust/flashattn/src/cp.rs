//! Context parallelism (ring attention) through libflashattn_cp, experimental as its header
//! (`include/flashattn/flashattn_cp.h`) says. One sequence of S = W·L tokens over W ranks, each
//! holding L rows of Q, K and V: contiguous chunks when non-causal, the zigzag layout when causal
//! ([`shard_rows`] gives a rank's global rows in local order).
use std::ffi::{c_void, CStr};
use std::ptr::{self, NonNull};

use crate::sys::cp as csys;
use crate::{sys, Backend, DType, Element, Error, I64Param, Plan, Result, Status, Workspace};

fn cp_check(raw: sys::flashattn_status_t) -> Result<()> {
    match Status::from_raw(raw) {
        None => Ok(()),
        Some(status) => {
            let message = unsafe {
                let p = csys::flashattn_cp_last_error();
                if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
            };
            Err(Error::new(status, message))
        }
    }
}

/// The global rows rank `rank` of `world_size` holds, in its local order (L = `local_rows`).
pub fn shard_rows(world_size: usize, rank: usize, local_rows: usize, causal: bool) -> Vec<usize> {
    assert!(rank < world_size, "rank {rank} is not below the world size {world_size}");
    if !causal {
        return (rank * local_rows..(rank + 1) * local_rows).collect();
    }
    assert!(local_rows % 2 == 0, "the causal zigzag layout needs an even number of local rows");
    let c = local_rows / 2;
    let second = 2 * world_size - 1 - rank;
    (rank * c..(rank + 1) * c).chain(second * c..(second + 1) * c).collect()
}

/// A finalized `flashattn_cp_plan_t`, destroyed on drop.
pub struct CpPlan {
    raw: NonNull<csys::flashattn_cp_plan_t>,
    local_ranks: usize,
    extents: crate::Extents,
    // What the host-slice calls check (the local plan's, read once: the C ring keeps nothing of it).
    dtype: Option<DType>,
    backend: Backend,
    backward_backend: Option<Backend>,
}

impl Drop for CpPlan {
    fn drop(&mut self) {
        unsafe { csys::flashattn_cp_plan_destroy(self.raw.as_ptr()) }
    }
}

impl CpPlan {
    fn build(local: &Plan, world_size: usize, rank: usize, transport: csys::flashattn_cp_transport_t,
             comm: *mut c_void) -> Result<CpPlan> {
        let mut raw = ptr::null_mut();
        cp_check(unsafe { csys::flashattn_cp_plan_create(&mut raw) })?;
        let plan = CpPlan {
            raw: NonNull::new(raw).expect("flashattn_cp_plan_create returned success and NULL"),
            local_ranks: if transport == csys::FLASHATTN_CP_TRANSPORT_LOOPBACK { world_size } else { 1 },
            extents: local.extents()?,
            dtype: DType::from_raw(local.get_i64(I64Param::Dtype)?),
            backend: local.backend()?.0,
            backward_backend: local.backward_backend().ok().map(|(b, _)| b),
        };
        let p = plan.raw.as_ptr();
        unsafe {
            cp_check(csys::flashattn_cp_plan_set_i64(p, csys::FLASHATTN_CP_I64_WORLD_SIZE, world_size as i64))?;
            cp_check(csys::flashattn_cp_plan_set_i64(p, csys::FLASHATTN_CP_I64_RANK, rank as i64))?;
            cp_check(csys::flashattn_cp_plan_set_i64(p, csys::FLASHATTN_CP_I64_TRANSPORT, i64::from(transport)))?;
            if !comm.is_null() {
                cp_check(csys::flashattn_cp_plan_set_nccl_comm(p, comm))?;
            }
            cp_check(csys::flashattn_cp_plan_finalize(p, local.as_ptr()))?;
        }
        Ok(plan)
    }

    /// Every rank played by this process in turn (`local`: a finalized CPU or GPU plan of one
    /// rank's share); execute takes `world_size` tensors per argument.
    pub fn loopback(local: &Plan, world_size: usize) -> Result<CpPlan> {
        CpPlan::build(local, world_size, 0, csys::FLASHATTN_CP_TRANSPORT_LOOPBACK, ptr::null_mut())
    }

    /// One rank over the caller's NCCL communicator (`comm`: an `ncclComm_t`).
    ///
    /// # Safety
    /// `comm` must be a live NCCL communicator of `world_size` ranks in which this is `rank`, and
    /// outlive the plan's executes.
    pub unsafe fn nccl(local: &Plan, world_size: usize, rank: usize, comm: *mut c_void) -> Result<CpPlan> {
        if comm.is_null() {
            return Err(Error::new(Status::InvalidArgument, "comm: NULL"));
        }
        CpPlan::build(local, world_size, rank, csys::FLASHATTN_CP_TRANSPORT_NCCL, comm)
    }

    /// Ranks whose tensors one execute takes (W for loopback, 1 for NCCL).
    pub fn local_ranks(&self) -> usize {
        self.local_ranks
    }

    pub fn workspace_size(&self) -> Result<usize> {
        let mut bytes = 0usize;
        cp_check(unsafe { csys::flashattn_cp_plan_get_workspace_size(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Bytes of workspace one backward execute needs (not the forward's); `NotSupported` with the
    /// reason when the local plan's backend has no backward pass for this problem.
    pub fn backward_workspace_size(&self) -> Result<usize> {
        let mut bytes = 0usize;
        cp_check(unsafe { csys::flashattn_cp_plan_get_backward_workspace_size(self.raw.as_ptr(), &mut bytes) })?;
        Ok(bytes)
    }

    /// Host slices of `T` need a plan of `T`'s dtype (else the library would read or write past
    /// their ends) whose pass (the backward when `backward`) runs on the CPU backend.
    fn check_host_kind<T: Element>(&self, backward: bool) -> Result<()> {
        if self.dtype != Some(T::DTYPE) {
            return Err(Error::new(Status::InvalidArgument,
                format!("slices of {:?} elements, but the plan's dtype is {:?}", T::DTYPE, self.dtype)));
        }
        let backend = if backward { self.backward_backend } else { Some(self.backend) };
        if let Some(b) = backend.filter(|&b| b != Backend::Cpu) {
            return Err(Error::new(Status::InvalidArgument,
                format!("host slices need the CPU backend; this ring runs {b:?} (use the _raw call with device memory)")));
        }
        Ok(())
    }

    /// One slice per rank, each holding at least `need` elements (`lens`: argument `name`'s slices' lengths).
    fn check_host_lengths(&self, name: &str, lens: &[usize], need: usize) -> Result<()> {
        let n = self.local_ranks;
        if lens.len() != n {
            return Err(Error::new(Status::InvalidArgument, format!("{name}: {} slices for {n} rank(s)", lens.len())));
        }
        if let Some((r, len)) = lens.iter().enumerate().find(|(_, &len)| len < need) {
            return Err(Error::new(Status::InvalidArgument, format!("{name}[{r}]: {len} elements, the plan needs {need}")));
        }
        Ok(())
    }

    /// The loopback ring on host slices (CPU backend): one slice per rank for each argument, each
    /// holding at least what the local plan's tensor spans; `lse`, when given, one fp32
    /// [batch, heads_q, L] slice per rank. The workspace is allocated for this call.
    pub fn execute_host<T: Element>(&self, q: &[&[T]], k: &[&[T]], v: &[&[T]], o: &mut [&mut [T]],
                                    lse: Option<&mut [&mut [f32]]>) -> Result<()> {
        self.check_host_kind::<T>(false)?;
        let n = self.local_ranks;
        let e = &self.extents;
        let short = |name: &str, len: usize, need: usize, r: usize| {
            Error::new(Status::InvalidArgument, format!("{name}[{r}]: {len} elements, the plan needs {need}"))
        };
        for (name, list, need) in [("q", q, e.q), ("k", k, e.k), ("v", v, e.v)] {
            if list.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("{name}: {} slices for {n} rank(s)", list.len())));
            }
            if let Some((r, s)) = list.iter().enumerate().find(|(_, s)| s.len() < need) {
                return Err(short(name, s.len(), need, r));
            }
        }
        if o.len() != n {
            return Err(Error::new(Status::InvalidArgument, format!("o: {} slices for {n} rank(s)", o.len())));
        }
        if let Some((r, s)) = o.iter().enumerate().find(|(_, s)| s.len() < e.o) {
            return Err(short("o", s.len(), e.o, r));
        }
        let mut lse_ptrs: Vec<*mut f32> = Vec::new();
        if let Some(l) = lse {
            if l.len() != n {
                return Err(Error::new(Status::InvalidArgument, format!("lse: {} slices for {n} rank(s)", l.len())));
            }
            if let Some((r, s)) = l.iter().enumerate().find(|(_, s)| s.len() < e.lse) {
                return Err(short("lse", s.len(), e.lse, r));
            }
            lse_ptrs = l.iter_mut().map(|s| s.as_mut_ptr()).collect();
        }
        let qp: Vec<*const c_void> = q.iter().map(|s| s.as_ptr() as *const c_void).collect();
        let kp: Vec<*const c_void> = k.iter().map(|s| s.as_ptr() as *const c_void).collect();
        let vp: Vec<*const c_void> = v.iter().map(|s| s.as_ptr() as *const c_void).collect();
        let op: Vec<*mut c_void> = o.iter_mut().map(|s| s.as_mut_ptr() as *mut c_void).collect();
        let mut ws = Workspace::new(self.workspace_size()?);
        let (ws_ptr, ws_bytes) = ws.raw();
        unsafe { self.execute_raw(&qp, &kp, &vp, &op, if lse_ptrs.is_empty() { None } else { Some(&lse_ptrs) },
                                  ws_ptr, ws_bytes, ptr::null_mut()) }
    }

    /// The loopback ring's backward pass on host slices (CPU backend): from the forward's `q`,
    /// `k`, `v`, `o` and `lse` (one fp32 [batch, heads_q, L] slice per rank, required) and `dout`
    /// (layout of O), writes every rank's `dq`, `dk`, `dv` (layouts of Q, K, V): the gradients with
    /// respect to the whole sequence, restricted to the rank's rows. One slice per rank for each
    /// argument, each holding at least what the local plan's tensor spans. The workspace is
    /// allocated for this call.
    #[allow(clippy::too_many_arguments)]
    pub fn execute_backward_host<T: Element>(&self, q: &[&[T]], k: &[&[T]], v: &[&[T]], o: &[&[T]], dout: &[&[T]],
                                             lse: &[&[f32]], dq: &mut [&mut [T]], dk: &mut [&mut [T]],
                                             dv: &mut [&mut [T]]) -> Result<()> {
        if self.backward_backend.is_none() {
            self.backward_workspace_size()?; // NotSupported with the library's reason
        }
        self.check_host_kind::<T>(true)?;
        let e = &self.extents;
        let lens = |list: &[&[T]]| list.iter().map(|s| s.len()).collect::<Vec<_>>();
        let lens_mut = |list: &[&mut [T]]| list.iter().map(|s| s.len()).collect::<Vec<_>>();
        for (name, list, need) in [("q", q, e.q), ("k", k, e.k), ("v", v, e.v), ("o", o, e.o), ("dout", dout, e.dout)] {
            self.check_host_lengths(name, &lens(list), need)?;
        }
        self.check_host_lengths("lse", &lse.iter().map(|s| s.len()).collect::<Vec<_>>(), e.lse)?;
        for (name, list, need) in [("dq", &*dq, e.dq), ("dk", &*dk, e.dk), ("dv", &*dv, e.dv)] {
            self.check_host_lengths(name, &lens_mut(list), need)?;
        }
        let inputs = |list: &[&[T]]| list.iter().map(|s| s.as_ptr() as *const c_void).collect::<Vec<_>>();
        let outputs = |list: &mut [&mut [T]]| list.iter_mut().map(|s| s.as_mut_ptr() as *mut c_void).collect::<Vec<_>>();
        let lp: Vec<*const f32> = lse.iter().map(|s| s.as_ptr()).collect();
        let (dqp, dkp, dvp) = (outputs(dq), outputs(dk), outputs(dv));
        let mut ws = Workspace::new(self.backward_workspace_size()?);
        let (ws_ptr, ws_bytes) = ws.raw();
        unsafe {
            self.execute_backward_raw(&inputs(q), &inputs(k), &inputs(v), &inputs(o), &inputs(dout), &lp, &dqp, &dkp,
                                      &dvp, ws_ptr, ws_bytes, ptr::null_mut())
        }
    }

    /// `flashattn_cp_plan_execute` with raw pointers (device memory and a `cudaStream_t` on GPUs).
    ///
    /// # Safety
    /// As [`Plan::execute_raw`], for each rank's tensors; the slices hold [`CpPlan::local_ranks`]
    /// pointers each.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_raw(&self, q: &[*const c_void], k: &[*const c_void], v: &[*const c_void], o: &[*mut c_void],
                              lse: Option<&[*mut f32]>, workspace: *mut c_void, workspace_bytes: usize,
                              stream: *mut c_void) -> Result<()> {
        let n = self.local_ranks;
        if q.len() != n || k.len() != n || v.len() != n || o.len() != n || lse.is_some_and(|l| l.len() != n) {
            return Err(Error::new(Status::InvalidArgument, format!("every pointer array must hold {n} entries")));
        }
        cp_check(csys::flashattn_cp_plan_execute(self.raw.as_ptr(), n as i32, q.as_ptr(), k.as_ptr(), v.as_ptr(),
                                                 o.as_ptr(), lse.map_or(ptr::null(), |l| l.as_ptr()), workspace,
                                                 workspace_bytes, stream as sys::flashattn_stream_t))
    }

    /// `flashattn_cp_plan_execute_backward` with raw pointers (device memory and a `cudaStream_t`
    /// on GPUs); `lse` is required.
    ///
    /// # Safety
    /// As [`Plan::backward_raw`], for each rank's tensors; the slices hold [`CpPlan::local_ranks`]
    /// pointers each, and `dq`, `dk`, `dv` must not overlap each other, any input or the workspace.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn execute_backward_raw(&self, q: &[*const c_void], k: &[*const c_void], v: &[*const c_void],
                                       o: &[*const c_void], dout: &[*const c_void], lse: &[*const f32],
                                       dq: &[*mut c_void], dk: &[*mut c_void], dv: &[*mut c_void],
                                       workspace: *mut c_void, workspace_bytes: usize, stream: *mut c_void)
                                       -> Result<()> {
        let n = self.local_ranks;
        if [q.len(), k.len(), v.len(), o.len(), dout.len(), lse.len(), dq.len(), dk.len(), dv.len()].iter().any(|&l| l != n) {
            return Err(Error::new(Status::InvalidArgument, format!("every pointer array must hold {n} entries")));
        }
        cp_check(csys::flashattn_cp_plan_execute_backward(self.raw.as_ptr(), n as i32, q.as_ptr(), k.as_ptr(),
                                                          v.as_ptr(), o.as_ptr(), dout.as_ptr(), lse.as_ptr(),
                                                          dq.as_ptr(), dk.as_ptr(), dv.as_ptr(), workspace,
                                                          workspace_bytes, stream as sys::flashattn_stream_t))
    }
}
