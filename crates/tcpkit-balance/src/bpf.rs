//! The Rust side of bpf/balance.h, generated from it by build.rs (bindgen): the map keys and
//! values the loader writes and reads, the `--trace` event, and the header's constants. The
//! header is their one definition; what is written here by hand is only what Rust needs on top:
//! the `Pod` impls aya asks of map types, and the constants in the types the code indexes with.

mod generated {
    #![expect(
        non_camel_case_types,
        reason = "bindgen keeps the header's __u32-style typedefs"
    )]
    #![expect(
        clippy::allow_attributes_without_reason,
        reason = "bindgen's compile-time layout checks carry a plain #[allow]"
    )]
    include!(concat!(env!("OUT_DIR"), "/balance.rs"));
}

pub use generated::{
    Active, Backend, PersistKey, PersistVal, Revnat, SockTag, Svc, SvcKey, TraceEvent,
};
pub use generated::{
    ALGO_LC, ALGO_MAGLEV_CLIENT, ALGO_MAGLEV_COOKIE, ALGO_MAGLEV_HOST, ALGO_RANDOM,
    ALGO_ROUND_ROBIN, ALGO_WEIGHTED, ALGO_WLC, ALGO_WRR, COUNTERS, COUNTER_REFUSED, COUNTER_REVNAT,
    COUNTER_STALE, COUNTER_TRACE_LOST, COUNTER_TRANSLATED, COUNTER_UNTAGGED, MAX_OVERFLOW,
    MAX_PERSIST, MAX_SOCKETS,
};

/// A service's backend slots (MAX_BACKENDS).
pub const MAX_BACKENDS: usize = generated::MAX_BACKENDS as usize;
/// Services the maps hold at once (MAX_SERVICES).
pub const MAX_SERVICES: usize = generated::MAX_SERVICES as usize;
/// Slots of a weighted or maglev service's table (RING_SIZE).
pub const RING_SIZE: usize = generated::RING_SIZE as usize;
/// Backend sets per service, the one in use and the one being written (GENERATIONS).
pub const GENERATIONS: usize = generated::GENERATIONS as usize;
/// Words of the vip_ports bitmap (VIP_PORT_WORDS).
pub const VIP_PORT_WORDS: usize = generated::VIP_PORT_WORDS as usize;

// SAFETY (each impl below): the struct is #[repr(C)] (bindgen's output), made of integers and
// arrays of integers only, so every bit pattern is a valid value; and it has no padding bytes,
// which aya would copy to the kernel uninitialised: build.rs compiles the programs with
// -Wpadded as an error, so a header struct with a hole, inside or at its end, does not build.
// SAFETY: as above.
unsafe impl aya::Pod for SvcKey {}
// SAFETY: as above.
unsafe impl aya::Pod for Svc {}
// SAFETY: as above.
unsafe impl aya::Pod for Backend {}
// SAFETY: as above.
unsafe impl aya::Pod for Revnat {}
// SAFETY: as above.
unsafe impl aya::Pod for Active {}
// SAFETY: as above.
unsafe impl aya::Pod for PersistKey {}
// SAFETY: as above.
unsafe impl aya::Pod for PersistVal {}
// SAFETY: as above.
unsafe impl aya::Pod for SockTag {}
