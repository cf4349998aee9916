//! The view's core against a reference model: random sequences of opens,
//! reads, blocks completing, failure, shutdown and the end of the run,
//! each answered as a plain model of the view says it must be.
//!
//! The model knows only what a reader can see: a file's size, its data
//! (the sample array's bytes from the tests' oracle, which shares nothing
//! with the crate's geometry), that bytes before the data (a
//! header) are answered at once, and that data of a pending block wait
//! for it. The core's replies, parked or not, must match the model's
//! after every step.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::{mpsc, Arc};

use proptest::prelude::*;

use rechunkfs::format::BlockFormat;
use rechunkfs::input::InputArray;
use rechunkfs::plan::{self, Problem, Strategy as PlanStrategy};
use rechunkfs::view::staging::{Manifest, Staging};
use rechunkfs::view::{BlockTemplates, ViewCore, ViewLayout, ROOT_INO};
use rechunkfs::DType;

/// One step of a random sequence. Block and byte positions are fractions
/// of what exists, so every step applies to any array.
#[derive(Clone, Debug)]
enum Op {
    Open {
        block: u16,
    },
    OpenForWriting {
        block: u16,
    },
    Read {
        block: u16,
        at: u16,
        size: u16,
    },
    /// A read starting or ending near a boundary of the file (the end of
    /// its header, the end of the file), where off-by-ones live.
    ReadNear {
        block: u16,
        end_of_file: bool,
        ends_there: bool,
        delta: i8,
        size: u16,
    },
    Complete {
        block: u16,
    },
    TakeUrgent,
    Fail,
    Shutdown,
    FinishIfAllDone,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => any::<u16>().prop_map(|block| Op::Open { block }),
        1 => any::<u16>().prop_map(|block| Op::OpenForWriting { block }),
        8 => (any::<u16>(), any::<u16>(), 1..4096u16)
            .prop_map(|(block, at, size)| Op::Read { block, at, size }),
        4 => any::<u16>().prop_map(|block| Op::Complete { block }),
        4 => (any::<u16>(), any::<bool>(), any::<bool>(), -3i8..=3, 1..64u16).prop_map(
            |(block, end_of_file, ends_there, delta, size)| Op::ReadNear {
                block,
                end_of_file,
                ends_there,
                delta,
                size,
            }
        ),
        1 => Just(Op::TakeUrgent),
        1 => Just(Op::Fail),
        1 => Just(Op::Shutdown),
        1 => Just(Op::FinishIfAllDone),
    ]
}

/// One output block as a reader sees it.
struct ModelBlock {
    name: String,
    data: Vec<u8>,
    /// Bytes before the data: known to the model only by their length.
    header_len: u64,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Phase {
    Materialising,
    Failed,
    Stopping,
    Complete,
}

type Reply = Result<Vec<u8>, i32>;

/// What the view must do, and the reads it holds.
struct Model {
    blocks: Vec<ModelBlock>,
    done: BTreeSet<usize>,
    phase: Phase,
    /// Parked reads: read id -> (block, offset, end).
    parked: BTreeMap<u64, (usize, u64, u64)>,
    /// Blocks with parked reads, in the order their first read parked,
    /// not yet taken as urgent.
    urgent: Vec<usize>,
    /// Header bytes as first served, per block: later reads must agree.
    headers: BTreeMap<usize, Vec<Option<u8>>>,
}

impl Model {
    fn file_len(&self, block: usize) -> u64 {
        self.blocks[block].header_len + self.blocks[block].data.len() as u64
    }

    /// The reply a read of `block` at `offset..end` (clipped to the file)
    /// must get now; `None` when it must wait.
    fn answer(&self, block: usize, offset: u64, end: u64) -> Option<Expected> {
        let header = self.blocks[block].header_len;
        if offset >= end {
            return Some(Expected::Bytes(Vec::new()));
        }
        if end <= header || self.done.contains(&block) {
            return Some(Expected::File { block, offset, end });
        }
        match self.phase {
            Phase::Materialising => None,
            Phase::Failed | Phase::Stopping | Phase::Complete => Some(Expected::Error(libc::EIO)),
        }
    }
}

/// What a reply must be.
#[derive(Debug)]
enum Expected {
    Bytes(Vec<u8>),
    /// Bytes `offset..end` of `block`'s file: in its header, or anywhere
    /// once the block is complete.
    File {
        block: usize,
        offset: u64,
        end: u64,
    },
    Error(i32),
}

struct Harness {
    _root: tempfile::TempDir,
    core: Arc<ViewCore>,
    model: Model,
    inos: Vec<u64>,
    replies: mpsc::Receiver<(u64, Reply)>,
    reply_to: mpsc::Sender<(u64, Reply)>,
    next_read: u64,
    /// Expected replies of reads not yet answered by the core.
    pending: BTreeMap<u64, Expected>,
    format: BlockFormat,
}

fn harness(array: &[u64], block: &[u64], format: BlockFormat) -> Harness {
    let root = tempfile::tempdir().expect("temp dir");
    let dtype: DType = "<u2".parse().expect("dtype");
    // The core reads nothing of the input; the manifest only names it.
    let input_dir = common::make_blocks(root.path(), "in", array, array, dtype, BlockFormat::Npy);
    let input = InputArray::scan(&input_dir, None).expect("scan");
    let problem = Problem::new(array.to_vec(), array.to_vec(), block.to_vec(), 2).expect("problem");
    let files = rechunkfs::output::filetree::output_file_shape(format, &problem.output());
    let problem = problem.with_files(input.files.clone(), files);
    let plan = plan::plan(&problem, PlanStrategy::Keep, None).expect("plan");
    let manifest = Manifest::new(&input, block, format);
    let (staging, done) =
        Staging::open(&root.path().join("staging"), &manifest, false).expect("staging");
    assert!(done.is_empty());
    let layout = ViewLayout {
        source: input.source.clone(),
        array: array.to_vec(),
        input_block: input.block_shape.clone(),
        output_block: block.to_vec(),
        output: rechunkfs::output::directory::OutputSpec {
            format,
            dataset: "/data".into(),
            dtype,
            space: rechunkfs::array::space::Space::identity(array.len()),
            axis_order: rechunkfs::array::axes::AxisOrder::C,
            encoding: Default::default(),
            commit_batch_bytes: rechunkfs::output::directory::COMMIT_BATCH_BYTES,
        },
    };
    let templates = BlockTemplates::for_view(&layout, &plan.output).expect("templates");
    let core = Arc::new(ViewCore::new(
        layout,
        &plan,
        templates,
        Arc::new(staging),
        &done,
    ));
    let blocks = model_blocks(array, block, 2, format.extension());
    let mut inos = Vec::new();
    let mut modelled = Vec::new();
    for mut b in blocks {
        let attr = core
            .lookup(ROOT_INO, OsStr::new(&b.name))
            .unwrap_or_else(|e| panic!("{}: lookup errno {e}", b.name));
        assert!(
            attr.size >= b.data.len() as u64,
            "{}: {} bytes hold {} of data",
            b.name,
            attr.size,
            b.data.len()
        );
        b.header_len = attr.size - b.data.len() as u64;
        if format == BlockFormat::Raw {
            assert_eq!(b.header_len, 0, "{}: raw blocks are data only", b.name);
        }
        inos.push(attr.ino);
        modelled.push(b);
    }
    let (reply_to, replies) = mpsc::channel();
    Harness {
        _root: root,
        core,
        model: Model {
            blocks: modelled,
            done: BTreeSet::new(),
            phase: Phase::Materialising,
            parked: BTreeMap::new(),
            urgent: Vec::new(),
            headers: BTreeMap::new(),
        },
        inos,
        replies,
        reply_to,
        next_read: 0,
        pending: BTreeMap::new(),
        format,
    }
}

/// Every output block of `array` in blocks of `block`: its name
/// (`i_j_k.EXT`, C order) and data, from the oracle.
fn model_blocks(array: &[u64], block: &[u64], elem: usize, extension: &str) -> Vec<ModelBlock> {
    common::oracle::grid_blocks(array, block)
        .into_iter()
        .map(|b| ModelBlock {
            name: format!("{}.{extension}", b.stem()),
            data: common::oracle::sample_bytes(array, &b.origin, &b.shape, elem),
            header_len: 0,
        })
        .collect()
}

impl Harness {
    fn block_of(&self, pick: u16) -> usize {
        pick as usize % self.model.blocks.len()
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Open { block } => {
                let b = self.block_of(block);
                let opened = self.core.open(self.inos[b], false);
                assert!(
                    opened.is_ok(),
                    "open of {}: {opened:?}",
                    self.model.blocks[b].name
                );
            }
            Op::OpenForWriting { block } => {
                let b = self.block_of(block);
                assert_eq!(self.core.open(self.inos[b], true), Err(libc::EROFS));
            }
            Op::Read { block, at, size } => {
                let b = self.block_of(block);
                // Past the end now and then, as readers do.
                let offset = (at as u64 * (self.model.file_len(b) + 16)) / u16::MAX as u64;
                self.read(b, offset, size);
            }
            Op::ReadNear {
                block,
                end_of_file,
                ends_there,
                delta,
                size,
            } => {
                let b = self.block_of(block);
                let boundary = if end_of_file {
                    self.model.file_len(b)
                } else {
                    self.model.blocks[b].header_len
                };
                let near = boundary.saturating_add_signed(delta as i64);
                let offset = if ends_there {
                    near.saturating_sub(size as u64)
                } else {
                    near
                };
                self.read(b, offset, size);
            }
            Op::Complete { block } => self.complete(self.block_of(block)),
            Op::TakeUrgent => {
                let taken = self.core.take_urgent();
                let expected: Vec<u64> = std::mem::take(&mut self.model.urgent)
                    .into_iter()
                    .filter(|b| !self.model.done.contains(b))
                    .map(|b| self.rank(b))
                    .collect();
                assert_eq!(taken, expected, "urgent blocks");
            }
            Op::Fail => {
                self.core.fail("injected".into());
                self.end(Phase::Failed);
            }
            Op::Shutdown => {
                self.core.shutdown();
                self.end(Phase::Stopping);
            }
            Op::FinishIfAllDone => {
                if self.model.done.len() == self.model.blocks.len() {
                    self.core.finish(&Default::default());
                    // Only a run still materialising completes; one already
                    // failed or stopping keeps saying so.
                    if self.model.phase == Phase::Materialising {
                        self.end(Phase::Complete);
                    }
                }
            }
        }
        self.check_replies();
        self.check_status();
    }

    /// The core's rank of model block `b`, found through its file name.
    fn rank(&self, b: usize) -> u64 {
        (0..self.model.blocks.len() as u64)
            .find(|&rank| self.core.block_name(rank) == self.model.blocks[b].name)
            .expect("every model block is a view block")
    }

    fn read(&mut self, b: usize, offset: u64, size: u16) {
        let end = (offset + size as u64)
            .min(self.model.file_len(b))
            .max(offset);
        let id = self.next_read;
        self.next_read += 1;
        match self.model.answer(b, offset, end) {
            Some(expected) => {
                self.pending.insert(id, expected);
            }
            None => {
                if !self.model.parked.values().any(|(pb, _, _)| *pb == b) {
                    self.model.urgent.push(b);
                }
                self.model.parked.insert(id, (b, offset, end));
            }
        }
        let reply_to = self.reply_to.clone();
        self.core.read(
            self.inos[b],
            0,
            offset,
            size as u32,
            Box::new(move |reply| {
                let _ = reply_to.send((id, reply));
            }),
        );
    }

    /// Stages block `b`'s file as the materialiser would (header, then the
    /// model's data) and marks it done. A block in flight may complete
    /// after a failure or a shutdown too; it is then served like any other.
    fn complete(&mut self, b: usize) {
        if self.model.done.contains(&b) {
            return;
        }
        let rank = self.rank(b);
        let header = self.core.template(rank).prefix.clone();
        assert_eq!(header.len() as u64, self.model.blocks[b].header_len);
        let mut file = header;
        file.extend_from_slice(&self.model.blocks[b].data);
        std::fs::write(self.core.staged_path(rank), &file).expect("stage a block");
        self.core.mark_done(&[rank]);
        self.model.done.insert(b);
        let woken: Vec<u64> = self
            .model
            .parked
            .iter()
            .filter(|(_, (pb, _, _))| *pb == b)
            .map(|(id, _)| *id)
            .collect();
        for id in woken {
            let (_, offset, end) = self.model.parked.remove(&id).expect("parked");
            self.pending.insert(
                id,
                Expected::File {
                    block: b,
                    offset,
                    end,
                },
            );
        }
    }

    /// Materialising ends: every parked read gets EIO.
    fn end(&mut self, phase: Phase) {
        if self.model.phase != Phase::Complete {
            self.model.phase = phase;
        }
        for (id, _) in std::mem::take(&mut self.model.parked) {
            self.pending.insert(id, Expected::Error(libc::EIO));
        }
    }

    /// Every reply the model expects has come, and no other.
    fn check_replies(&mut self) {
        while let Ok((id, reply)) = self.replies.try_recv() {
            let expected = self
                .pending
                .remove(&id)
                .unwrap_or_else(|| panic!("read {id} answered while it should wait: {reply:?}"));
            self.check_reply(id, expected, reply);
        }
        assert!(
            self.pending.is_empty(),
            "reads the model expects answered are not: {:?}",
            self.pending.keys().collect::<Vec<_>>()
        );
    }

    fn check_reply(&mut self, id: u64, expected: Expected, reply: Reply) {
        match expected {
            Expected::Bytes(bytes) => assert_eq!(reply, Ok(bytes), "read {id}"),
            Expected::Error(errno) => assert_eq!(reply, Err(errno), "read {id}"),
            Expected::File { block, offset, end } => {
                let bytes = reply.unwrap_or_else(|e| panic!("read {id}: errno {e}"));
                assert_eq!(bytes.len() as u64, end - offset, "read {id}: length");
                self.check_bytes(block, offset, &bytes);
            }
        }
    }

    /// Bytes at `offset` of `block`'s file: data bytes equal the model's;
    /// header bytes equal those served before at the same place, and an
    /// npy header starts with npy's magic.
    fn check_bytes(&mut self, block: usize, offset: u64, bytes: &[u8]) {
        let name = &self.model.blocks[block].name;
        let header_len = self.model.blocks[block].header_len as usize;
        let data = &self.model.blocks[block].data;
        let header = self
            .model
            .headers
            .entry(block)
            .or_insert_with(|| vec![None; header_len]);
        for (i, &byte) in bytes.iter().enumerate() {
            let at = offset as usize + i;
            if at < header_len {
                let seen = header[at].get_or_insert(byte);
                assert_eq!(byte, *seen, "{name}: header byte {at} changed");
                if self.format == BlockFormat::Npy && at < 6 {
                    assert_eq!(byte, b"\x93NUMPY"[at], "{name}: npy magic byte {at}");
                }
            } else {
                assert_eq!(byte, data[at - header_len], "{name}: byte {at}");
            }
        }
    }

    fn check_status(&self) {
        let status = self.core.status();
        assert_eq!(status.blocks_done, self.model.done.len() as u64);
        assert_eq!(status.blocks_total, self.model.blocks.len() as u64);
        assert_eq!(status.waiting_reads, self.model.parked.len() as u64);
        let state = match self.model.phase {
            Phase::Materialising => "materialising",
            Phase::Failed => "failed",
            Phase::Stopping => "stopping",
            Phase::Complete => "complete",
        };
        assert_eq!(status.state, state);
    }
}

/// A small array of 1 to 4 dimensions and a block shape for it, dividing
/// it or not.
fn array_and_block() -> impl Strategy<Value = (Vec<u64>, Vec<u64>)> {
    (1usize..=4)
        .prop_flat_map(|ndim| {
            (
                proptest::collection::vec(1u64..=9, ndim),
                proptest::collection::vec(1u64..=9, ndim),
            )
        })
        .prop_map(|(array, block)| {
            let block = block
                .iter()
                .zip(&array)
                .map(|(b, a)| (*b).min(*a))
                .collect();
            (array, block)
        })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_view_core_answers_every_read_as_the_model_does(
        (array, block) in array_and_block(),
        npy in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let format = if npy { BlockFormat::Npy } else { BlockFormat::Raw };
        let mut harness = harness(&array, &block, format);
        for op in &ops {
            harness.apply(op);
        }
        // Completing every block answers every read still parked.
        for b in 0..harness.model.blocks.len() {
            harness.complete(b);
            harness.check_replies();
        }
        prop_assert!(harness.model.parked.is_empty() || harness.model.phase != Phase::Materialising);
    }
}
