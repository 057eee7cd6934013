//! The server's allocations, counted by a global allocator that wraps the
//! system's (feature `count-allocations`, off by default: every
//! allocation then costs two atomic additions, so a build that measures
//! CPU time leaves it off). `scripts/cost-per-request` with
//! `COUNT_ALLOCATIONS=1` reads the counts at `GET /allocations` before
//! and after its window and divides by the requests served.

/// Where the counts are served, outside any guard.
pub(crate) const PATH: &str = "/allocations";

#[cfg(feature = "count-allocations")]
#[global_allocator]
static GLOBAL: &stats_alloc::StatsAlloc<std::alloc::System> = &stats_alloc::INSTRUMENTED_SYSTEM;

/// The counts so far, one `name value` pair a line: allocations
/// (reallocations not included), reallocations, and the bytes allocated
/// (reallocations' growth included); `None` in a build without the
/// feature.
pub(crate) fn counts() -> Option<String> {
    #[cfg(feature = "count-allocations")]
    {
        let stats = GLOBAL.stats();
        Some(format!(
            "allocations {}\nreallocations {}\nbytes {}\n",
            stats.allocations,
            stats.reallocations,
            stats.bytes_allocated + stats.bytes_reallocated.max(0) as usize,
        ))
    }
    #[cfg(not(feature = "count-allocations"))]
    {
        None
    }
}
