//! What this CPU (and its operating system) lets the kernels use, probed once per process.
//!
//! Nothing here picks a kernel: [`super::Tier`] filters these features, and each kernel family
//! dispatches on the filtered set ([`super::Tier::caps`]).

/// The instruction-set features the crate's kernels use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    /// x86-64 AVX2.
    pub avx2: bool,
    /// x86-64 FMA (three-operand fused multiply-add).
    pub fma: bool,
    /// x86-64 F16C (f16 ↔ f32 conversions).
    pub f16c: bool,
    /// x86-64 AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` and `vpdpwssd` (Intel Alder Lake and
    /// later, N100 included; AMD Zen 5).
    pub avx_vnni: bool,
    /// x86-64 AVX-512 F, BW and VL (the three the AVX-512 kernels need together).
    pub avx512: bool,
    /// x86-64 AVX-512 VNNI (`vpdpbusd`, `vpdpwssd`).
    pub avx512_vnni: bool,
    /// x86-64 AVX-512 BF16 (`vdpbf16ps`).
    pub avx512_bf16: bool,
    /// `vdpbf16ps` multiplies twice the pairs an f32 fused multiply-add does per cycle: AMD's
    /// Zen 4 and later (AMD's optimization guide), where the decoder's bf16 products pay; Intel
    /// issues it on one port against two for FMA (measured here: 110 against 230 GFLOP/s on one
    /// core of a Sapphire Rapids), so there the exact f32 products are as fast.
    pub bf16_dot_fast: bool,
    /// x86-64 AMX with bf16 tiles, and the operating system's permission to use them.
    pub amx_bf16: bool,
    /// aarch64 Advanced SIMD.
    pub neon: bool,
    /// aarch64 `sdot`/`udot` (FEAT_DotProd).
    pub dotprod: bool,
}

impl Features {
    /// This CPU's features, probed on the first call (the AMX permission is asked of the
    /// operating system then, once, for the whole process).
    pub fn get() -> Features {
        static FEATURES: std::sync::OnceLock<Features> = std::sync::OnceLock::new();
        *FEATURES.get_or_init(probe)
    }

    /// The feature names set, in this struct's order (for logs and skipped-test messages).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.avx2, "avx2"),
            (self.fma, "fma"),
            (self.f16c, "f16c"),
            (self.avx_vnni, "avxvnni"),
            (self.avx512, "avx512f+bw+vl"),
            (self.avx512_vnni, "avx512vnni"),
            (self.avx512_bf16, "avx512bf16"),
            (self.bf16_dot_fast, "fast-bf16-dot"),
            (self.amx_bf16, "amx-bf16"),
            (self.neon, "neon"),
            (self.dotprod, "dotprod"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Features {
    use std::arch::is_x86_feature_detected as has;
    let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    Features {
        avx2: has!("avx2"),
        fma: has!("fma"),
        f16c: has!("f16c"),
        avx_vnni: has!("avxvnni"),
        avx512,
        avx512_vnni: avx512 && has!("avx512vnni"),
        avx512_bf16: avx512 && has!("avx512bf16"),
        bf16_dot_fast: avx512 && has!("avx512bf16") && vendor_is_amd(),
        amx_bf16: amx_permitted(),
        ..Features::default()
    }
}

#[cfg(target_arch = "aarch64")]
fn probe() -> Features {
    use std::arch::is_aarch64_feature_detected as has;
    Features {
        neon: has!("neon"),
        dotprod: has!("dotprod"),
        ..Features::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn probe() -> Features {
    Features::default()
}

/// Whether CPUID names AMD as the vendor (`AuthenticAMD`).
#[cfg(target_arch = "x86_64")]
fn vendor_is_amd() -> bool {
    // Safe to call since Rust 1.94; `unsafe` for the older toolchains of the stated MSRV.
    #[allow(unused_unsafe)]
    // SAFETY: CPUID leaf 0 exists on every x86_64 CPU.
    let r = unsafe { std::arch::x86_64::__cpuid(0) };
    let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    bytes == b"AuthenticAMD"
}

/// Whether this CPU has AMX-BF16 and Linux lets this process use the tile registers (asked with
/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, which lasts for the whole process).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_permitted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `cpuid` leaf 7 exists on every x86-64 CPU that reports it as its maximum leaf or
    // above, checked first; the syscall only changes this process's permitted XSAVE features.
    unsafe {
        use std::arch::x86_64::{__cpuid, __cpuid_count};
        if __cpuid(0).eax < 7 {
            return false;
        }
        let edx = __cpuid_count(7, 0).edx;
        // AMX-BF16 is bit 22, AMX-TILE bit 24.
        if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
            return false;
        }
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn amx_permitted() -> bool {
    false
}
