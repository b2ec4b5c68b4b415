//! The crate's CPU kernels, and the one policy that picks among them.
//!
//! Contract: every `std::arch` intrinsic, `#[target_feature]` function and inline `asm!` of the
//! crate lives under this module; the stages call the families below and never an intrinsic.
//! Features are probed once ([`Features::get`]); a [`Tier`] caps them (`QTTS_KERNELS`, or
//! `--kernels` through [`force`]), and each family dispatches on the capped set ([`Tier::caps`]).
//! Every fast kernel has a scalar twin in its family, which the tests hold it to: bit for bit
//! where the family's doc says the arithmetic is fixed, else within a stated bound.
//! Nothing here allocates on a hot path but per-thread scratch that grows on first use.
//!
//! The families:
//! - [`quant`]: matrix products over q8_0, q4_K and q5_K rows packed 16 at a time (the code
//!   predictor's and the talker's layers, the packed sample heads), bit-identical on every tier.
//! - [`dot`]: the sample heads' f32 and q8_0 dot products in one fixed order, bit-identical.
//! - [`snake`]: the decoder's SnakeBeta activation, bit-identical.
//! - [`attend`]: one row's attention over q8_0 caches (the talker's steps), within rounding.
//! - [`bf16`]: the decoder's products on bf16 weights (AMX tiles, or AVX-512 BF16 dot products),
//!   within the bf16 products' rounding.
//! - [`panel`]: the decoder's exact f32 products on weights packed in column panels,
//!   bit-identical.
//!
//! What this policy does not reach: ggml's kernels (llama.cpp's talker, the graphs' own ops) are
//! chosen when llama.cpp is built, for the building CPU (`.cargo/config.toml`), and
//! `matrixmultiply`'s f32 products by that crate at run time.

pub mod attend;
pub mod bf16;
pub mod dot;
pub mod features;
pub mod int8;
pub mod panel;
pub mod quant;
pub mod snake;

#[cfg(target_arch = "aarch64")]
mod aarch64;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use features::Features;

/// A matrix product kernel over quantized rows, as [`crate::ffi::Context::map_mat`] calls it:
/// `n` rows of `k` weights at `w` (`row_bytes` apart, in the kernel's layout) times `m` input rows
/// of `k` f32 at `x`; output `j` of row `r` goes to `y[j · y_stride + r]`.
///
/// # Safety
/// The pointers are valid for those extents, the outputs do not overlap the inputs, and the CPU
/// has the kernel's features (each family hands out only kernels it checked).
pub type MatKernel = unsafe fn(
    w: *const u8,
    row_bytes: usize,
    n: usize,
    k: usize,
    x: *const f32,
    m: usize,
    y: *mut f32,
    y_stride: usize,
);

/// A level of kernels: each allows the features of the ones below it and its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Portable Rust only: the reference every other tier is tested against.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C (most laptops and desktops since 2013).
    Avx2,
    /// AVX2 and AVX-VNNI (Intel Alder Lake and later, N100 included; AMD Zen 5): the quantized
    /// products by 256-bit `vpdpbusd`.
    AvxVnni,
    /// x86-64 AVX-512 F, BW and VL, with VNNI and BF16 where the CPU has them (Intel Ice Lake
    /// and later servers, AMD Zen 4 and 5).
    Avx512,
    /// AVX-512 and AMX bf16 tiles (Intel Sapphire Rapids and later).
    Amx,
    /// aarch64 Advanced SIMD, with the dot-product instructions where the CPU has them.
    Neon,
}

impl Tier {
    /// Every tier, lowest first per architecture.
    pub const ALL: [Tier; 6] = [
        Tier::Scalar,
        Tier::Avx2,
        Tier::AvxVnni,
        Tier::Avx512,
        Tier::Amx,
        Tier::Neon,
    ];

    /// The name `QTTS_KERNELS` and `--kernels` take.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Scalar => "scalar",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "avxvnni",
            Tier::Avx512 => "avx512",
            Tier::Amx => "amx",
            Tier::Neon => "neon",
        }
    }

    /// The tier named `s` (as [`Tier::name`] writes it, any case).
    pub fn parse(s: &str) -> Result<Tier, KernelsError> {
        Tier::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| KernelsError::Unknown {
                found: s.to_string(),
            })
    }

    /// What the tier needs that this CPU lacks, or `None` when it runs here.
    pub fn missing(self) -> Option<&'static str> {
        let f = Features::get();
        let avx2 = f.avx2 && f.fma && f.f16c;
        match self {
            Tier::Scalar => None,
            Tier::Avx2 if !avx2 => Some("AVX2, FMA and F16C"),
            Tier::AvxVnni if !(avx2 && f.avx_vnni) => Some("AVX2, FMA, F16C and AVX-VNNI"),
            Tier::Avx512 | Tier::Amx if !(avx2 && f.avx512) => Some("AVX-512 F, BW and VL"),
            Tier::Amx if !f.amx_bf16 => Some("AMX-BF16 (or the OS's permission to use it)"),
            Tier::Neon if !f.neon => Some("aarch64 Advanced SIMD"),
            _ => None,
        }
    }

    /// Whether this CPU runs the tier.
    pub fn available(self) -> bool {
        self.missing().is_none()
    }

    /// The highest tier this CPU runs.
    pub fn best() -> Tier {
        [
            Tier::Amx,
            Tier::Avx512,
            Tier::AvxVnni,
            Tier::Avx2,
            Tier::Neon,
        ]
        .into_iter()
        .find(|t| t.available())
        .unwrap_or(Tier::Scalar)
    }

    /// Every tier this CPU runs, lowest first.
    pub fn available_tiers() -> Vec<Tier> {
        Tier::ALL.into_iter().filter(|t| t.available()).collect()
    }

    /// The tier's features ([`Tier::caps`]), then the same without each optional feature a
    /// family dispatches on within the tier (NEON's dot products, which a Cortex-A72 lacks):
    /// every kernel variant a CPU of this tier may run, for the tests.
    pub fn variants(self) -> Vec<Features> {
        let caps = self.caps();
        let mut v = vec![caps];
        if caps.dotprod {
            v.push(Features {
                dotprod: false,
                ..caps
            });
        }
        v
    }

    /// This CPU's features that the tier allows (none of another architecture's, none of a
    /// higher tier's).
    pub fn caps(self) -> Features {
        let f = Features::get();
        let mut c = Features::default();
        if self >= Tier::Avx2 && self <= Tier::Amx {
            (c.avx2, c.fma, c.f16c) = (f.avx2, f.fma, f.f16c);
        }
        if self >= Tier::AvxVnni && self <= Tier::Amx {
            c.avx_vnni = f.avx_vnni;
        }
        if self >= Tier::Avx512 && self <= Tier::Amx {
            (c.avx512, c.avx512_vnni, c.avx512_bf16) = (f.avx512, f.avx512_vnni, f.avx512_bf16);
            c.bf16_dot_fast = f.bf16_dot_fast;
        }
        if self == Tier::Amx {
            c.amx_bf16 = f.amx_bf16;
        }
        if self == Tier::Neon {
            (c.neon, c.dotprod) = (f.neon, f.dotprod);
        }
        c
    }
}

impl std::fmt::Display for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A tier that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelsError {
    /// `QTTS_KERNELS` or `--kernels` names no tier. Use one of the names listed.
    #[error(
        "unknown kernel tier {found:?}: expected one of scalar, avx2, avxvnni, avx512, amx, neon"
    )]
    Unknown {
        /// What was given.
        found: String,
    },
    /// The tier asked for needs features this CPU lacks. Ask for one of the available tiers
    /// (or unset `QTTS_KERNELS` for the best one).
    #[error(
        "kernel tier {tier} needs {missing}, which this CPU lacks; available here: {available}"
    )]
    Unavailable {
        /// The tier asked for.
        tier: Tier,
        /// What the CPU lacks.
        missing: &'static str,
        /// The tiers this CPU runs.
        available: String,
    },
    /// [`force`] came after the tier was fixed for this process (by a first use, `QTTS_KERNELS`
    /// or an earlier call). Force the tier before loading anything.
    #[error("kernel tier already fixed to {fixed} for this process, cannot switch to {asked}")]
    AlreadyFixed {
        /// The tier in use.
        fixed: Tier,
        /// The tier asked for.
        asked: Tier,
    },
}

impl From<KernelsError> for crate::ModelError {
    fn from(e: KernelsError) -> Self {
        crate::ModelError::Unsupported {
            what: "kernel tier (QTTS_KERNELS, --kernels)".into(),
            expected: format!(
                "one of the tiers this CPU runs: {}",
                list(&Tier::available_tiers())
            ),
            found: e.to_string(),
        }
    }
}

fn list(tiers: &[Tier]) -> String {
    tiers
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `tier` if this CPU runs it, else why not.
pub fn check(tier: Tier) -> Result<Tier, KernelsError> {
    match tier.missing() {
        None => Ok(tier),
        Some(missing) => Err(KernelsError::Unavailable {
            tier,
            missing,
            available: list(&Tier::available_tiers()),
        }),
    }
}

static SELECTED: std::sync::OnceLock<Result<Tier, KernelsError>> = std::sync::OnceLock::new();

/// The tier this process runs: the one [`force`]d, else `QTTS_KERNELS`'s, else [`Tier::best`];
/// fixed by the first call. An unknown name or a tier this CPU lacks is an error (the loaders
/// return it), never a silent fallback.
pub fn selected() -> Result<Tier, KernelsError> {
    SELECTED
        .get_or_init(|| match std::env::var("QTTS_KERNELS") {
            Ok(s) if !s.trim().is_empty() => Tier::parse(&s).and_then(check),
            _ => Ok(Tier::best()),
        })
        .clone()
}

/// [`selected`], or [`Tier::best`] when it is an error (which the loaders have reported).
pub fn active() -> Tier {
    selected().unwrap_or_else(|_| Tier::best())
}

/// The features of the [`active`] tier.
pub fn caps() -> Features {
    static CAPS: std::sync::OnceLock<Features> = std::sync::OnceLock::new();
    *CAPS.get_or_init(|| active().caps())
}

/// Fixes this process's tier (the CLI's `--kernels`), before anything has used the kernels.
pub fn force(tier: Tier) -> Result<(), KernelsError> {
    check(tier)?;
    let fixed = SELECTED.get_or_init(|| Ok(tier)).clone()?;
    if fixed == tier {
        Ok(())
    } else {
        Err(KernelsError::AlreadyFixed { fixed, asked: tier })
    }
}

/// For tests: `f(tier)` for every tier this CPU runs, and a line naming each one it lacks and
/// why (so that a tier is never passed silently).
pub fn for_each_tier(mut f: impl FnMut(Tier)) {
    for t in Tier::ALL {
        match t.missing() {
            None => f(t),
            Some(missing) => eprintln!("skipped: kernel tier {t} (this CPU lacks {missing})"),
        }
    }
}

/// Reads every byte of `bytes` as wide vectors as the tier's features allow, and returns a sum
/// of them (so that no load can be skipped): the read bandwidth a kernel streaming its weights
/// from the same place could reach (`benches/kernels.rs`).
pub fn read_all(bytes: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if caps().avx512 {
        // SAFETY: the CPU has AVX-512 F (the tier's features are the CPU's).
        return unsafe { x86::avx512::read_all(bytes) };
    }
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .fold(0u64, u64::wrapping_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tier's name parses back to it, in any case; an unknown name is refused with the
    /// list of every tier's name.
    #[test]
    fn tier_names_round_trip_and_unknown_ones_list_them_all() {
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.name()), Ok(t));
            assert_eq!(Tier::parse(&t.name().to_uppercase()), Ok(t));
        }
        let e = Tier::parse("avx9").unwrap_err().to_string();
        for t in Tier::ALL {
            assert!(e.contains(t.name()), "{e} does not name {t}");
        }
    }

    /// A tier allows only its own and lower features: avxvnni never hands out AVX-512 (so it
    /// stands in for an AVX2 + AVX-VNNI CPU), avx2 never AVX-VNNI, and each tier's caps are the
    /// CPU's where allowed.
    #[test]
    fn tiers_cap_the_features() {
        let f = Features::get();
        let vnni = Tier::AvxVnni.caps();
        assert!(!vnni.avx512 && !vnni.avx512_vnni && !vnni.avx512_bf16 && !vnni.amx_bf16);
        assert_eq!(vnni.avx_vnni, f.avx_vnni);
        assert_eq!(vnni.avx2, f.avx2);
        let avx2 = Tier::Avx2.caps();
        assert!(!avx2.avx_vnni && !avx2.avx512);
        assert_eq!(Tier::Avx512.caps().avx_vnni, f.avx_vnni);
        assert_eq!(Tier::Scalar.caps(), Features::default());
        assert_eq!(
            Tier::AvxVnni.missing().is_none(),
            f.avx2 && f.fma && f.f16c && f.avx_vnni
        );
    }
}
