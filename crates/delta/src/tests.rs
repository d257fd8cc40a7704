use std::io;

use bytes::Bytes;
use rand::{Rng, RngCore, SeedableRng};

use crate::plan::plan_image;
use crate::*;

/// A store in memory; reads past its end fail as a file's would.
struct Memory(Vec<u8>);

impl BlockStore for Memory {
    fn read_exact_at(&mut self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = offset as usize;
        let source = self
            .0
            .get(start..start + buf.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(source);
        Ok(())
    }

    fn write_all_at(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let start = offset as usize;
        self.0
            .get_mut(start..start + data.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::WriteZero))?
            .copy_from_slice(data);
        Ok(())
    }
}

const BS: BlockSize = BlockSize::DEFAULT;
const B: usize = 4096;

fn digests(image: &[u8], block_size: BlockSize) -> Vec<BlockDigest> {
    image
        .chunks(block_size.bytes() as usize)
        .map(BlockDigest::of)
        .collect()
}

fn random(len: usize, seed: u64) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    data
}

fn plan(old: &[u8], new: &[u8], block_size: BlockSize) -> Vec<Op> {
    let planner = Planner::new(block_size, old.len() as u64, digests(old, block_size)).unwrap();
    plan_image(&planner, new)
}

/// Plans `old` -> `new`, checks the operations cover the new image's blocks
/// once and in order, applies them beside and in place, and returns them.
fn round_trip(old: &[u8], new: &[u8], block_size: BlockSize) -> Vec<Op> {
    let ops = plan(old, new, block_size);
    let mut next = 0;
    for op in &ops {
        assert_eq!(op.start(), next, "{ops:?}");
        next += op.count(block_size);
    }
    assert_eq!(next, block_size.blocks_in(new.len() as u64));

    let (old_len, new_len) = (old.len() as u64, new.len() as u64);
    let mut beside = Memory(vec![0; new.len()]);
    apply_beside(
        &mut Memory(old.to_vec()),
        &mut beside,
        block_size,
        old_len,
        new_len,
        &ops,
    )
    .unwrap();
    assert!(beside.0 == new, "beside: the built image differs");

    // A block device is as large as the larger image and keeps what lies
    // past the new one.
    let mut device = Memory(old.to_vec());
    device.0.resize(old.len().max(new.len()), 0);
    let old_digests = digests(old, block_size);
    let mut checked = CheckedReads {
        store: &mut device,
        block_size,
        old_len,
        old: &old_digests,
    };
    apply_in_place(&mut checked, block_size, old_len, new_len, &ops).unwrap();
    assert!(device.0[..new.len()] == *new, "in place: the image differs");

    // The device's end check, made from the operations alone, agrees with
    // the host's, made from the new image, both ways.
    let expected = ImageDigest::of_blocks(block_size, new_len, &digests(new, block_size));
    let mut composed_beside = Composition::beside(block_size, new_len);
    let mut composed_in_place = Composition::in_place(block_size, new_len, old_len, &old_digests);
    for op in &ops {
        composed_beside.record(op, &old_digests).unwrap();
        if !op.is_unchanged() {
            composed_in_place.record(op, &old_digests).unwrap();
        }
    }
    for composed in [composed_beside, composed_in_place] {
        let (blocks, digest) = composed.finish().unwrap();
        assert_eq!(blocks, digests(new, block_size));
        assert_eq!(digest, expected);
    }
    ops
}

fn replaced_bytes(ops: &[Op]) -> usize {
    ops.iter()
        .map(|op| match op {
            Op::Replace { data, .. } => data.len(),
            _ => 0,
        })
        .sum()
}

#[test]
fn an_unchanged_image_is_one_copy_in_place() {
    let old = random(64 * B + 100, 1);
    let ops = round_trip(&old, &old, BS);
    assert_eq!(
        ops,
        vec![Op::Copy {
            start: 0,
            from: 0,
            count: 65
        }]
    );
    assert!(InPlaceSchedule::new(&ops).steps.is_empty());
}

#[test]
fn changed_blocks_are_sent_and_nothing_else() {
    let old = random(256 * B, 2);
    let mut new = old.clone();
    for block in [3usize, 4, 100, 255] {
        new[block * B + 7] ^= 0x5a;
    }
    let ops = round_trip(&old, &new, BS);
    assert_eq!(replaced_bytes(&ops), 4 * B);
}

#[test]
fn a_zeroed_region_is_a_zero_operation() {
    let old = random(64 * B, 3);
    let mut new = old.clone();
    new[8 * B..24 * B].fill(0);
    let ops = round_trip(&old, &new, BS);
    assert!(
        ops.contains(&Op::Zero {
            start: 8,
            count: 16
        }),
        "{ops:?}"
    );
    assert_eq!(replaced_bytes(&ops), 0);
}

#[test]
fn a_moved_file_is_copied_from_its_old_place() {
    let old = random(128 * B, 4);
    let mut new = random(128 * B, 5);
    new[..16 * B].copy_from_slice(&old[..16 * B]);
    // Blocks 40..60 of the old image now sit at 90..110.
    new[90 * B..110 * B].copy_from_slice(&old[40 * B..60 * B]);
    let ops = round_trip(&old, &new, BS);
    assert!(
        ops.contains(&Op::Copy {
            start: 90,
            from: 40,
            count: 20
        }),
        "{ops:?}"
    );
    assert_eq!(replaced_bytes(&ops), (128 - 16 - 20) * B);
}

#[test]
fn an_appended_image_sends_only_its_tail() {
    let old = random(64 * B, 6);
    let mut new = old.clone();
    new.extend_from_slice(&random(10 * B + 123, 7));
    let ops = round_trip(&old, &new, BS);
    assert_eq!(replaced_bytes(&ops), 10 * B + 123);
}

#[test]
fn a_shrunk_image_sends_nothing_but_its_new_short_tail() {
    let old = random(64 * B, 8);
    let new = old[..40 * B + 1000].to_vec();
    let ops = round_trip(&old, &new, BS);
    // The last block is short now: not the old full block, so it is sent.
    assert_eq!(replaced_bytes(&ops), 1000);
}

#[test]
fn a_shift_by_one_block_is_a_chain_of_copies_with_nothing_staged() {
    let old = random(200 * B, 9);
    let mut new = random(B, 10);
    new.extend_from_slice(&old[..199 * B]);
    let ops = round_trip(&old, &new, BS);
    let schedule = InPlaceSchedule::new(&ops);
    assert_eq!(schedule.slots, 0);
    assert_eq!(replaced_bytes(&ops), B);
    // Shifted towards the end: the last block is written first.
    assert_eq!(
        schedule.steps.first(),
        Some(&Step::Copy {
            block: 199,
            from: Read::Old(198)
        })
    );
}

#[test]
fn swapped_regions_stage_one_block_per_cycle() {
    let old = random(64 * B, 11);
    let mut new = old.clone();
    new[10 * B..20 * B].copy_from_slice(&old[40 * B..50 * B]);
    new[40 * B..50 * B].copy_from_slice(&old[10 * B..20 * B]);
    let ops = round_trip(&old, &new, BS);
    assert_eq!(replaced_bytes(&ops), 0);
    // Ten two-block cycles (block 10 <-> 40, 11 <-> 41, ...).
    assert_eq!(InPlaceSchedule::new(&ops).slots, 10);
}

#[test]
fn a_rotation_is_one_cycle_and_one_staged_block() {
    let old = random(50 * B, 12);
    let mut new = old[B..].to_vec();
    new.extend_from_slice(&old[..B]);
    let ops = round_trip(&old, &new, BS);
    assert_eq!(InPlaceSchedule::new(&ops).slots, 1);
}

#[test]
fn one_old_block_copied_to_many_places_is_read_before_it_is_overwritten() {
    let old = random(32 * B, 13);
    let mut new = random(32 * B, 14);
    for place in [0usize, 5, 9, 31] {
        new[place * B..(place + 1) * B].copy_from_slice(&old[9 * B..10 * B]);
    }
    round_trip(&old, &new, BS);
}

#[test]
fn images_that_do_not_fill_their_last_block() {
    for (old_len, new_len) in [(0, 5000), (5000, 0), (4095, 4097), (10 * B + 1, 10 * B + 1)] {
        let old = random(old_len, 15);
        let mut new = random(new_len, 16);
        let shared = old_len.min(new_len) / 2;
        new[..shared].copy_from_slice(&old[..shared]);
        round_trip(&old, &new, BS);
    }
}

#[test]
fn random_edits_rebuild_the_new_image_in_both_modes() {
    let block_size = BlockSize::new(512).unwrap();
    let b = 512usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for trial in 0..300 {
        let old_blocks = rng.random_range(0..80usize);
        let old = random(old_blocks * b + rng.random_range(0..b), trial);
        let mut new = old.clone();
        for _ in 0..rng.random_range(0..6) {
            let len = new.len();
            match rng.random_range(0..6) {
                // Change bytes.
                0 if len > 0 => {
                    let at = rng.random_range(0..len);
                    new[at] ^= 0xff;
                }
                // Zero a run.
                1 if len > 0 => {
                    let at = rng.random_range(0..len);
                    let end = (at + rng.random_range(0..4 * b)).min(len);
                    new[at..end].fill(0);
                }
                // Move a block-aligned run of the old image somewhere.
                2 if old.len() >= b && len >= b => {
                    let count = rng.random_range(1..=(old.len() / b).min(len / b));
                    let from = rng.random_range(0..=old.len() / b - count);
                    let to = rng.random_range(0..=len / b - count);
                    new[to * b..(to + count) * b]
                        .copy_from_slice(&old[from * b..(from + count) * b]);
                }
                // Append.
                3 => new.extend_from_slice(&random(rng.random_range(0..3 * b), trial + 1000)),
                // Shrink.
                4 => new.truncate(rng.random_range(0..=len)),
                // Swap two aligned blocks.
                _ if len >= 2 * b => {
                    let (x, y) = (rng.random_range(0..len / b), rng.random_range(0..len / b));
                    let block_x = new[x * b..(x + 1) * b].to_vec();
                    new.copy_within(y * b..(y + 1) * b, x * b);
                    new[y * b..(y + 1) * b].copy_from_slice(&block_x);
                }
                _ => {}
            }
        }
        round_trip(&old, &new, block_size);
    }
}

#[test]
fn planning_in_pieces_gives_the_same_operations() {
    let old = random(3000 * B, 18);
    let mut new = old.clone();
    new[100 * B..400 * B].copy_from_slice(&random(300 * B, 19));
    new[500 * B..900 * B].fill(0);
    let planner = Planner::new(BS, old.len() as u64, digests(&old, BS)).unwrap();
    let mut plan = Plan::new(BS);
    let mut streamed = Vec::new();
    for (index, block) in new.chunks(B).enumerate() {
        plan.push(index as u64, planner.decide(index as u64, block), block);
        streamed.extend(plan.take_closed());
    }
    streamed.extend(plan.finish());
    assert_eq!(streamed, plan_image(&planner, &new));
    // 300 changed blocks make REPLACEs of at most MAX_REPLACE_BYTES each.
    assert!(streamed.iter().all(|op| match op {
        Op::Replace { data, .. } => data.len() <= MAX_REPLACE_BYTES,
        _ => true,
    }));
    assert_eq!(replaced_bytes(&streamed), 300 * B);
}

#[test]
fn operations_outside_the_images_are_refused() {
    let (old_len, new_len) = (10 * B as u64, 8 * B as u64 + 10);
    let refused = |op: Op| {
        let error = check(&op, BS, old_len, new_len).unwrap_err();
        assert!(!error.to_string().is_empty());
        error
    };
    assert!(matches!(
        refused(Op::Zero { start: 8, count: 2 }),
        ApplyError::PastNewEnd { .. }
    ));
    assert!(matches!(
        refused(Op::Copy {
            start: 0,
            from: 9,
            count: 2
        }),
        ApplyError::PastOldEnd { .. }
    ));
    // The new image's short last block cannot come from a full old one.
    assert!(matches!(
        refused(Op::Copy {
            start: 8,
            from: 0,
            count: 1
        }),
        ApplyError::PastOldEnd { .. }
    ));
    assert!(matches!(
        refused(Op::Replace {
            start: 2,
            data: Bytes::from(vec![1; B + 1])
        }),
        ApplyError::ReplaceLength { .. }
    ));
    assert!(matches!(
        refused(Op::Zero {
            start: u64::MAX,
            count: 2
        }),
        ApplyError::PastNewEnd { .. }
    ));
    check(
        &Op::Replace {
            start: 8,
            data: Bytes::from(vec![1; 10]),
        },
        BS,
        old_len,
        new_len,
    )
    .unwrap();
}

#[test]
fn a_wrong_number_of_digests_is_refused() {
    let error = Planner::new(BS, 10 * B as u64 + 1, vec![BlockDigest([0; 16]); 10])
        .err()
        .unwrap();
    assert_eq!(error.expected, 11);
    assert!(BlockSize::new(3000).is_none());
    assert!(BlockSize::new(256).is_none());
    assert_eq!(BlockSize::new(65536).unwrap().bytes(), 65536);
}

mod wire_format {
    use super::*;
    use crate::wire::{encode, Decoder, Message, Target, WireError, MAX_BODY};
    use bytes::BytesMut;

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Begin {
                block_size: BS,
                new_len: 1 << 33,
                mode: 0o644,
                path: "/data/local/tmp/rootfs.img".into(),
            },
            Message::Index {
                target: Target::BlockDevice,
                old_len: 12345,
            },
            Message::Index {
                target: Target::Absent,
                old_len: 0,
            },
            Message::Regions {
                start: 3,
                digests: digests(&random(2 * B, 22), BS),
            },
            Message::Want {
                runs: vec![(0, 2), (7, 1)],
                last: false,
            },
            Message::Want {
                runs: Vec::new(),
                last: true,
            },
            Message::Digests {
                start: 7,
                digests: digests(&random(5 * B, 20), BS),
            },
            Message::Op(Op::Copy {
                start: 1,
                from: 2,
                count: 3,
            }),
            Message::Op(Op::Zero { start: 4, count: 5 }),
            // Compressible and incompressible data take different encodings.
            Message::Op(Op::Replace {
                start: 6,
                data: Bytes::from(vec![7u8; 3 * B]),
            }),
            Message::Op(Op::Replace {
                start: 9,
                data: Bytes::from(random(MAX_REPLACE_BYTES, 21)),
            }),
            Message::Op(Op::Xor {
                start: 11,
                data: Bytes::from(vec![0u8; 2 * B]),
            }),
            Message::End { digest: [1; 32] },
            Message::Done { digest: [2; 32] },
            Message::Fail {
                message: "couldn't open /dev/block/x: Permission denied".into(),
            },
        ]
    }

    #[test]
    fn every_message_survives_the_wire_in_pieces_of_any_size() {
        let messages = all_messages();
        let mut out = BytesMut::new();
        for message in &messages {
            encode(message, &mut out);
        }
        for piece in [1usize, 3, 4096, out.len()] {
            let mut decoder = Decoder::new();
            let mut decoded = Vec::new();
            for bytes in out.chunks(piece) {
                decoder.feed(bytes);
                while let Some(message) = decoder.next_message().unwrap() {
                    decoded.push(message);
                }
            }
            assert_eq!(decoded, messages);
            assert_eq!(decoder.pending(), 0);
        }
    }

    #[test]
    fn compressible_data_crosses_compressed() {
        let mut out = BytesMut::new();
        encode(
            &Message::Op(Op::Replace {
                start: 0,
                data: Bytes::from(vec![0x61u8; MAX_REPLACE_BYTES]),
            }),
            &mut out,
        );
        assert!(out.len() < 4096, "{} bytes", out.len());
    }

    fn decode_one(frame: &[u8]) -> Result<Option<Message>, WireError> {
        let mut decoder = Decoder::new();
        decoder.feed(frame);
        decoder.next_message()
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(body);
        frame
    }

    #[test]
    fn malformed_messages_are_refused_with_what_was_wrong() {
        let too_large = ((MAX_BODY + 1) as u32).to_le_bytes();
        assert_eq!(
            decode_one(&too_large),
            Err(WireError::TooLarge(MAX_BODY + 1))
        );
        assert_eq!(decode_one(&framed(b"Q")), Err(WireError::UnknownTag(b'Q')));
        for body in [
            &b""[..],
            b"C\x01\x02",
            b"Z",
            b"I\x07\0\0\0\0\0\0\0\0",
            b"D\0\0\0\0\0\0\0\0\x01\x02",
            b"E\x01",
        ] {
            let error = decode_one(&framed(body)).unwrap_err();
            assert!(matches!(error, WireError::Malformed { .. }), "{error}");
        }
        // A block size that is not a power of two.
        let mut begin = b"B".to_vec();
        begin.extend_from_slice(&3000u32.to_le_bytes());
        begin.extend_from_slice(&[0; 12]);
        assert!(decode_one(&framed(&begin))
            .unwrap_err()
            .to_string()
            .contains("block size 3000"));
        // Data that decompresses to more than announced.
        let bomb = zstd::bulk::compress(&vec![0u8; 1 << 20], 3).unwrap();
        let mut replace = b"R".to_vec();
        replace.extend_from_slice(&0u64.to_le_bytes());
        replace.extend_from_slice(&4096u32.to_le_bytes());
        replace.push(1);
        replace.extend_from_slice(&bomb);
        assert!(decode_one(&framed(&replace))
            .unwrap_err()
            .to_string()
            .contains("zstd"));
        // A frame cut short is not a message yet.
        assert_eq!(decode_one(&framed(b"E")[..3]), Ok(None));
    }
}

#[test]
fn in_place_copies_come_before_every_write() {
    let mut device = Memory(random(8 * B, 22));
    let zero = Op::Zero { start: 0, count: 1 };
    let copy = Op::Copy {
        start: 1,
        from: 2,
        count: 1,
    };
    let len = 8 * B as u64;
    assert!(matches!(
        apply_copies_in_place(&mut device, BS, len, len, &[copy.clone(), zero.clone()]),
        Err(ApplyError::NotACopy { .. })
    ));
    assert!(matches!(
        apply_write(&mut device, BS, len, len, &copy),
        Err(ApplyError::CopyAfterWrites { .. })
    ));
    apply_write(&mut device, BS, len, len, &zero).unwrap();
    assert!(device.0[..B].iter().all(|&b| b == 0));
}

#[test]
fn copies_first_then_writes_is_the_whole_plan() {
    let old = random(300 * B, 23);
    let mut new = old.clone();
    new[10 * B..30 * B].copy_from_slice(&old[200 * B..220 * B]);
    new[50 * B..60 * B].fill(0);
    new[70 * B..90 * B].copy_from_slice(&random(20 * B, 24));
    let planner = Planner::new(BS, old.len() as u64, digests(&old, BS)).unwrap();
    let decisions: Vec<Decision> = new
        .chunks(B)
        .enumerate()
        .map(|(i, block)| planner.decide(i as u64, block))
        .collect();
    let mut copies = Plan::keeping(BS, Keep::Copies);
    for (i, decision) in decisions.iter().enumerate() {
        // No data: a copies-only plan never looks at it.
        copies.push(i as u64, *decision, &[]);
    }
    let mut writes = Plan::keeping(BS, Keep::Writes);
    for (i, block) in new.chunks(B).enumerate() {
        writes.push(i as u64, decisions[i], block);
    }
    let (copies, writes) = (copies.finish(), writes.finish());
    assert!(copies.iter().all(|op| matches!(op, Op::Copy { .. })));
    assert!(writes.iter().all(|op| !matches!(op, Op::Copy { .. })));
    let mut all: Vec<Op> = copies.iter().chain(&writes).cloned().collect();
    all.sort_by_key(Op::start);
    assert_eq!(all, plan_image(&planner, &new));
    let mut device = Memory(old.clone());
    apply_copies_in_place(&mut device, BS, old.len() as u64, new.len() as u64, &copies).unwrap();
    for op in &writes {
        apply_write(&mut device, BS, old.len() as u64, new.len() as u64, op).unwrap();
    }
    assert!(device.0 == new);
}

#[test]
fn a_changed_copy_source_fails_an_in_place_delta() {
    // Block 3 moves to 0; the device's block 3 changed after its digests were taken.
    let old = random(8 * B, 30);
    let mut new = old.clone();
    new.copy_within(3 * B..4 * B, 0);
    let ops = plan(&old, &new, BS);
    assert!(
        ops.iter().any(|op| matches!(op, Op::Copy { from: 3, .. })),
        "{ops:?}"
    );
    let old_digests = digests(&old, BS);
    let mut device = Memory(old.clone());
    device.0[3 * B + 10] ^= 1;
    let mut checked = CheckedReads {
        store: &mut device,
        block_size: BS,
        old_len: old.len() as u64,
        old: &old_digests,
    };
    let error = apply_in_place(&mut checked, BS, old.len() as u64, new.len() as u64, &ops)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("old block 3 no longer has the digest"),
        "{error}"
    );
    // Nothing was written before the failed read: block 0 is as it was.
    assert_eq!(device.0[..B], old[..B]);
}

#[test]
fn a_block_nothing_wrote_fails_the_composition() {
    let new_len = 4 * B as u64;
    let mut composed = Composition::beside(BS, new_len);
    composed
        .record(&Op::Zero { start: 0, count: 2 }, &[])
        .unwrap();
    composed
        .record(
            &Op::Replace {
                start: 3,
                data: Bytes::from(vec![1u8; B]),
            },
            &[],
        )
        .unwrap();
    assert_eq!(
        composed.finish().unwrap_err(),
        CompositionError::Unwritten(2)
    );
}

#[test]
fn a_copy_of_an_old_block_past_the_digests_fails_the_composition() {
    let mut composed = Composition::beside(BS, B as u64);
    let error = composed
        .record(
            &Op::Copy {
                start: 0,
                from: 5,
                count: 1,
            },
            &digests(&random(2 * B, 31), BS),
        )
        .unwrap_err();
    assert!(
        matches!(error, CompositionError::NoOldBlock { block: 5, .. }),
        "{error}"
    );
}

#[test]
fn region_digests_differ_only_where_a_block_changed() {
    let blocks = REGION_BLOCKS as usize * 3 + 5;
    let old = random(blocks * 512, 32);
    let mut new = old.clone();
    // One byte in the second region.
    new[(REGION_BLOCKS as usize + 7) * 512] ^= 1;
    let bs = BlockSize::new(512).unwrap();
    let (old_regions, new_regions) = (
        region_digests(&digests(&old, bs)),
        region_digests(&digests(&new, bs)),
    );
    assert_eq!(old_regions.len() as u64, regions_in(blocks as u64));
    assert_eq!(old_regions.len(), 4);
    let differ: Vec<usize> = (0..4)
        .filter(|&r| old_regions[r] != new_regions[r])
        .collect();
    assert_eq!(differ, vec![1]);
    // A last block cut short changes the last region's digest.
    let cut = region_digests(&digests(&old[..old.len() - 1], bs));
    assert_eq!(cut[..3], old_regions[..3]);
    assert_ne!(cut[3], old_regions[3]);
}

#[test]
fn the_image_digest_covers_the_length_and_the_block_size() {
    let image = random(3 * B, 33);
    let blocks = digests(&image, BS);
    let digest = ImageDigest::of_blocks(BS, image.len() as u64, &blocks);
    assert_ne!(
        digest,
        ImageDigest::of_blocks(BS, image.len() as u64 + 1, &blocks)
    );
    let other = BlockSize::new(8192).unwrap();
    assert_ne!(
        digest,
        ImageDigest::of_blocks(other, image.len() as u64, &blocks)
    );
    assert_ne!(
        digest,
        ImageDigest::of_blocks(BS, image.len() as u64, &blocks[..2])
    );
}

/// `new` as `ops` with every REPLACE whose old blocks are there turned
/// into the XOR against them, as a host with the old image makes.
fn with_xors(ops: Vec<Op>, old: &[u8], new_len: usize) -> Vec<Op> {
    ops.into_iter()
        .map(|op| match op {
            Op::Replace { start, data }
                if (start as usize * B + data.len()) <= old.len()
                    && (data.len() % B == 0 || start as usize * B + data.len() == new_len)
                    && (data.len() % B == 0 || old.len() == new_len) =>
            {
                let at = start as usize * B;
                let delta: Vec<u8> = data
                    .iter()
                    .zip(&old[at..at + data.len()])
                    .map(|(n, o)| n ^ o)
                    .collect();
                Op::Xor {
                    start,
                    data: delta.into(),
                }
            }
            other => other,
        })
        .collect()
}

#[test]
fn xor_operations_rebuild_the_image_beside_and_in_place() {
    // A byte changed in every third block: the XORs are nearly all zero.
    let old = random(30 * B + 100, 40);
    let mut new = old.clone();
    for block in (0..30).step_by(3) {
        new[block * B + 17] ^= 0x5a;
    }
    new[30 * B + 50] ^= 1;
    let ops = with_xors(plan(&old, &new, BS), &old, new.len());
    let xors = ops.iter().filter(|op| matches!(op, Op::Xor { .. })).count();
    assert!(xors >= 10, "{ops:?}");
    let encoded: usize = ops
        .iter()
        .map(|op| match op {
            Op::Xor { data, .. } | Op::Replace { data, .. } => crate::wire::encoded_len(data),
            _ => 0,
        })
        .sum();
    assert!(encoded < 2 * B, "{encoded} bytes of XOR data");
    let (old_len, new_len) = (old.len() as u64, new.len() as u64);
    let old_digests = digests(&old, BS);

    let mut old_store = Memory(old.clone());
    let mut checked_old = CheckedReads {
        store: &mut old_store,
        block_size: BS,
        old_len,
        old: &old_digests,
    };
    let mut beside = Memory(vec![0; new.len()]);
    let mut composed = Composition::beside(BS, new_len);
    for op in &ops {
        let op = resolve_xor(&mut checked_old, BS, old_len, new_len, op).unwrap();
        apply_beside_op(&mut checked_old, &mut beside, BS, old_len, new_len, &op).unwrap();
        composed.record(&op, &old_digests).unwrap();
    }
    assert!(beside.0 == new);
    let expected = ImageDigest::of_blocks(BS, new_len, &digests(&new, BS));
    assert_eq!(composed.finish().unwrap().1, expected);

    let mut device = Memory(old.clone());
    apply_in_place(&mut device, BS, old_len, new_len, &ops).unwrap();
    assert!(device.0 == new);
}

#[test]
fn an_xor_past_the_old_image_or_unresolved_is_refused() {
    let xor = Op::Xor {
        start: 2,
        data: Bytes::from(vec![1u8; B]),
    };
    // The old image has two blocks: nothing to XOR block 2 with.
    let error = check(&xor, BS, 2 * B as u64, 3 * B as u64).unwrap_err();
    assert!(
        error.to_string().contains("reads past the old image"),
        "{error}"
    );
    let mut composed = Composition::beside(BS, 3 * B as u64);
    assert_eq!(
        composed.record(&xor, &[]).unwrap_err(),
        CompositionError::UnresolvedXor(2)
    );
}

/// The writes among `decisions` (blocks from `first`) as operations, with
/// their data from `new`.
fn write_ops(new: &[u8], block_size: BlockSize, first: u64, decisions: &[Decision]) -> Vec<Op> {
    let b = block_size.bytes() as usize;
    let mut plan = Plan::keeping_from(block_size, Keep::Writes, first);
    for (k, decision) in decisions.iter().enumerate() {
        let index = first as usize + k;
        let block = &new[index * b..((index + 1) * b).min(new.len())];
        plan.push(index as u64, *decision, block);
    }
    plan.finish()
}

/// Runs the host's pipeline against `old` as a device would answer it
/// (region digests 64 at a time), applying the early writes as they come,
/// then the copies and the other writes; returns the built image and how
/// many blocks were written early. With `hash_step`, the new image is
/// described that many blocks at a time, between the device's messages,
/// as a host still hashing it does; without, all of it first.
fn pipelined(
    old: &[u8],
    new: &[u8],
    block_size: BlockSize,
    in_place: bool,
    hash_step: Option<usize>,
) -> (Vec<u8>, usize) {
    let b = block_size.bytes() as usize;
    let infos: Vec<BlockInfo> = new.chunks(b).map(BlockInfo::of).collect();
    let (old_len, new_len) = (old.len() as u64, new.len() as u64);
    let (mut pipeline, mut fed) = match hash_step {
        None => (
            Pipeline::new(block_size, infos.clone(), old_len, in_place),
            infos.len(),
        ),
        Some(_) => (Pipeline::hashing(block_size, new_len, old_len, in_place), 0),
    };
    let old_digests = digests(old, block_size);
    let old_regions = region_digests(&old_digests);
    let mut device = Memory(old.to_vec());
    device.0.resize(old.len().max(new.len()), 0);
    let mut beside = Memory(vec![0; new.len()]);
    let mut written = vec![false; new.len().div_ceil(b)];
    let mut early = 0;
    let mut old_store = Memory(old.to_vec());
    let apply = |ops: Vec<Op>,
                 written: &mut Vec<bool>,
                 device: &mut Memory,
                 beside: &mut Memory,
                 old_store: &mut Memory| {
        for op in ops {
            for block in op.start()..op.start() + op.count(block_size) {
                written[block as usize] = true;
            }
            if in_place {
                apply_write(device, block_size, old_len, new_len, &op).unwrap();
            } else {
                apply_beside_op(old_store, beside, block_size, old_len, new_len, &op).unwrap();
            }
        }
    };
    let answer = |pipeline: &mut Pipeline, runs: Vec<(u64, u64)>| {
        for (first, count) in runs {
            let start = (first * REGION_BLOCKS) as usize;
            let end = ((first + count) * REGION_BLOCKS).min(old_digests.len() as u64) as usize;
            for (k, chunk) in old_digests[start..end].chunks(1000).enumerate() {
                pipeline.digests((start + k * 1000) as u64, chunk).unwrap();
            }
        }
    };
    let mut batches = old_regions.chunks(64).enumerate();
    loop {
        if let Some((batch, regions)) = batches.next() {
            let runs = pipeline.regions(batch as u64 * 64, regions).unwrap();
            answer(&mut pipeline, runs);
        }
        if let Some(step) = hash_step.filter(|_| fed < infos.len()) {
            let next = (fed + step).min(infos.len());
            let runs = pipeline.hashed(&infos[fed..next]);
            answer(&mut pipeline, runs);
            fed = next;
        }
        if pipeline.index_complete() && pipeline.hashing_done() {
            break;
        }
        assert!(
            batches.len() > 0 || fed < infos.len(),
            "everything sent and hashed, and the index is not complete"
        );
        if let Some((first, decisions)) = pipeline.early_writes() {
            early += decisions.iter().filter(|d| **d != Decision::Same).count();
            apply(
                write_ops(new, block_size, first, &decisions),
                &mut written,
                &mut device,
                &mut beside,
                &mut old_store,
            );
        }
    }
    let (decisions, rest) = pipeline.finish().unwrap();
    let mut copies = Plan::keeping(block_size, Keep::Copies);
    for (index, decision) in decisions.iter().enumerate() {
        copies.push(index as u64, *decision, &[]);
    }
    let copies = copies.finish();
    for copy in &copies {
        if let (Op::Copy { from, count, start }, true) = (copy, in_place) {
            for source in *from..from + count {
                if source != *start + (source - from) {
                    assert!(
                        !written.get(source as usize).copied().unwrap_or(false),
                        "a copy reads block {source}, written early"
                    );
                }
            }
        }
    }
    if in_place {
        apply_copies_in_place(&mut device, block_size, old_len, new_len, &copies).unwrap();
    } else {
        for copy in &copies {
            apply_beside_op(
                &mut old_store,
                &mut beside,
                block_size,
                old_len,
                new_len,
                copy,
            )
            .unwrap();
        }
    }
    apply(
        write_ops(new, block_size, 0, &rest),
        &mut written,
        &mut device,
        &mut beside,
        &mut old_store,
    );
    let built = if in_place {
        device.0[..new.len()].to_vec()
    } else {
        beside.0
    };
    (built, early)
}

#[test]
fn the_pipeline_writes_early_and_still_builds_the_image() {
    // 512-byte blocks: 200 regions of 256 blocks, past the lookahead.
    let block_size = BlockSize::new(512).unwrap();
    let b = 512usize;
    let blocks = 200 * REGION_BLOCKS as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(50);
    for trial in 0..6u64 {
        let old = random(blocks * b, 60 + trial);
        let mut new = old.clone();
        for _ in 0..40 {
            let at = rng.random_range(0..blocks - 600);
            let count = rng.random_range(1..600);
            match rng.random_range(0..4) {
                // New bytes.
                0 => new[at * b..(at + count) * b]
                    .copy_from_slice(&random(count * b, trial * 100 + at as u64)),
                // Zeros.
                1 => new[at * b..(at + count) * b].fill(0),
                // Old blocks from anywhere (moves both ways, far and near).
                _ => {
                    let from = rng.random_range(0..blocks - count);
                    new[at * b..(at + count) * b]
                        .copy_from_slice(&old[from * b..(from + count) * b]);
                }
            }
        }
        if trial % 2 == 1 {
            new.truncate(new.len() - rng.random_range(1..5000));
        }
        // The new image described all at once, and as a host hashing it
        // would, in steps smaller and larger than a region.
        for hash_step in [None, Some(100), Some(3000)] {
            for in_place in [true, false] {
                let (built, early) = pipelined(&old, &new, block_size, in_place, hash_step);
                assert!(
                    built == new,
                    "trial {trial}, in place {in_place}, {hash_step:?}: the image differs"
                );
                assert!(
                    early > 0,
                    "trial {trial}, in place {in_place}, {hash_step:?}: nothing was written early"
                );
            }
        }
    }
}

#[test]
fn the_digest_of_zeros_is_the_digest_of_a_zero_block() {
    for len in [0, 1, 4095, 4096, 4097, 65536, 1 << 20] {
        assert_eq!(
            BlockDigest::of_zeros(len),
            BlockDigest::of(&vec![0u8; len]),
            "{len}"
        );
    }
}
