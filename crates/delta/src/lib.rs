//! Block deltas: a new image described as operations on the old one, the
//! way Android's OTA snapshots describe an update (AOSP
//! `libsnapshot/include/libsnapshot/cow_format.h`), so that a push of an
//! image of which a build changed a few percent sends about that few
//! percent (docs/delta.md).
//!
//! Both images are cut into aligned blocks ([`BlockSize`]). The device knows
//! the old image and describes it by the [`BlockDigest`] of each block; the
//! host knows the new one and, block by block, decides with a [`Planner`]
//! whether it is unchanged, zero, a copy of an old block found anywhere, or
//! new data. [`Plan`] coalesces those decisions into [`Op`]s. Applied beside
//! the old image (a regular file built next to the old one), any order is
//! right; applied in place (a block device), a copy must read its source
//! before anything overwrites it, which [`InPlaceSchedule`] orders, staging
//! the few blocks that copies in a cycle need.
//!
//! Nothing here does I/O: the host's and the daemon's drivers read and write
//! through [`BlockStore`]s and carry operations over the wire.

#![forbid(unsafe_code)]

mod apply;
mod block;
mod compose;
mod digest;
mod pipeline;
mod plan;
mod schedule;
pub mod wire;

pub use apply::{
    apply_beside, apply_beside_op, apply_copies_in_place, apply_in_place, apply_write, check,
    resolve_xor, write_zeros, ApplyError, BlockStore,
};
pub use block::BlockSize;
pub use compose::{CheckedReads, Composition, CompositionError};
pub use digest::{
    region_digest, region_digests, regions_in, BlockDigest, ImageDigest, DIGEST_LEN, REGION_BLOCKS,
};
pub use pipeline::{Pipeline, PipelineError, LOOKAHEAD_REGIONS};
pub use plan::{
    plan_image, BlockInfo, Decision, DigestCountError, Keep, Op, Plan, Planner, MAX_REPLACE_BYTES,
};
pub use schedule::{InPlaceSchedule, Read, Step};

#[cfg(test)]
mod tests;
