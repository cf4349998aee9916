//! TIFF and BigTIFF files, in either byte order: their pages (images), each
//! cut into strips or tiles, read through the `tiff` crate's directory
//! parser; and the decoding of one compressed strip or tile
//! ([`ChunkDecode`], an implementation of
//! [`BlockDecode`](super::decode::BlockDecode)).
//!
//! A page's samples are stored in the file's byte order, compressed or
//! not; decoded chunks are put back into that order, so every block of an
//! array keeps one dtype. Values are never inverted or scaled (a
//! `WhiteIsZero` page is read as stored, as tifffile reads it).

mod chunk;

use std::io::{self, BufReader, Read, Seek};
use std::path::Path;

use tiff::decoder::{Decoder, Limits};
use tiff::tags::{ByteOrder, Tag};

use chunk::{bad, compression_name, NONE};
pub use chunk::{ChunkDecode, NAME};

use crate::array::dtype::{DType, Endian, Kind};
use crate::error::{Error, Result};
use crate::format::traits::FormatTraits;

/// The most pages one file may have: each is an entry in memory and its
/// directory a read at the scan.
const MAX_PAGES: usize = 1 << 20;

/// The largest tag value read from a directory (a strip offset table):
/// large enough for 2^22 BigTIFF strips, small enough that a damaged count
/// cannot exhaust memory.
const MAX_TAG_BYTES: usize = 32 << 20;

/// How a page is cut into the pieces its file stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chunking {
    /// Rows of the whole width, `rows` per strip (the last may have fewer).
    Strips { rows: u64 },
    /// Tiles of `width` × `length`, edge tiles padded to the full tile.
    Tiles { width: u64, length: u64 },
}

/// SGI's tag for a page that is a volume of this many slices.
const IMAGE_DEPTH: u16 = 32997;

/// One page (image file directory) of a TIFF file.
#[derive(Clone, Debug)]
pub struct Page {
    /// Its position among the file's pages, from 0.
    pub number: usize,
    pub width: u64,
    pub height: u64,
    /// Samples per pixel.
    pub samples: u64,
    /// Whether the samples are stored in separate planes, one after
    /// another (`PlanarConfiguration` 2), not interleaved.
    pub planar: bool,
    /// The samples' type, in the file's byte order.
    pub dtype: DType,
    pub compression: u16,
    pub predictor: u16,
    pub chunking: Chunking,
    /// Where each strip or tile starts in the file, and its bytes there.
    pub offsets: Vec<u64>,
    pub byte_counts: Vec<u64>,
}

impl Page {
    /// The page as an array, as tifffile reads it: (height, width), or
    /// with several samples per pixel (height, width, samples), or
    /// (samples, height, width) when they are stored in planes.
    pub fn shape(&self) -> Vec<u64> {
        match (self.samples, self.planar) {
            (1, _) => vec![self.height, self.width],
            (samples, false) => vec![self.height, self.width, samples],
            (samples, true) => vec![samples, self.height, self.width],
        }
    }

    /// The names of the axes of [`shape`](Self::shape), for messages.
    pub fn axes_text(&self) -> &'static str {
        match (self.samples, self.planar) {
            (1, _) => "height×width",
            (_, false) => "height×width×samples",
            (_, true) => "samples×height×width",
        }
    }

    /// Samples of a pixel in one strip or tile: one per plane when the
    /// samples are in planes.
    pub fn chunk_samples(&self) -> u64 {
        if self.planar {
            1
        } else {
            self.samples
        }
    }

    /// Bytes of the whole page.
    pub fn page_bytes(&self) -> u64 {
        self.height * self.width * self.samples * self.dtype.size as u64
    }

    /// Strips or tiles in one plane (the whole page, unless in planes).
    fn chunks_per_plane(&self) -> u64 {
        let (rows, width) = self.chunk_extent();
        self.height.div_ceil(rows) * self.width.div_ceil(width)
    }

    /// Rows and columns of a full strip or tile.
    pub fn chunk_extent(&self) -> (u64, u64) {
        match self.chunking {
            Chunking::Strips { rows } => (rows.min(self.height), self.width),
            Chunking::Tiles { width, length } => (length, width),
        }
    }

    /// Bytes of one pixel in a strip or tile.
    pub fn pixel_bytes(&self) -> u64 {
        self.chunk_samples() * self.dtype.size as u64
    }

    /// Rows of image data chunk `chunk` holds: a strip at the bottom may
    /// have fewer than the others; tiles always hold their full length.
    pub fn chunk_rows(&self, chunk: usize) -> u64 {
        let (rows, _) = self.chunk_extent();
        let in_plane = chunk as u64 % self.chunks_per_plane();
        match self.chunking {
            Chunking::Strips { .. } => rows.min(self.height - in_plane * rows),
            Chunking::Tiles { .. } => rows,
        }
    }

    /// How it is cut, in words: "strips of 8 rows", "tiles of 16×32".
    pub fn layout_text(&self) -> String {
        let (rows, width) = self.chunk_extent();
        match self.chunking {
            Chunking::Strips { .. } => format!("strips of {rows} rows"),
            Chunking::Tiles { .. } => format!("tiles of {rows}×{width}"),
        }
    }

    /// Whether its chunks must be decoded, not read in place.
    pub fn is_encoded(&self) -> bool {
        self.compression != NONE || self.predictor != 1
    }

    /// For an uncompressed page in strips that follow one another in the
    /// file, each exactly its rows long: where the page's raw C-order bytes
    /// start.
    pub fn contiguous_offset(&self) -> Option<u64> {
        if self.is_encoded() || matches!(self.chunking, Chunking::Tiles { .. }) {
            return None;
        }
        let row_bytes = self.width * self.pixel_bytes();
        let mut next = *self.offsets.first()?;
        for (strip, (&offset, &count)) in self.offsets.iter().zip(&self.byte_counts).enumerate() {
            let needed = self.chunk_rows(strip) * row_bytes;
            let last = strip + 1 == self.offsets.len();
            if offset != next || count < needed || (!last && count != needed) {
                return None;
            }
            next = offset + needed;
        }
        self.offsets.first().copied()
    }

    /// The decoder of strip or tile `chunk`, in a file of `byte_order`.
    pub fn chunk_decoder(&self, chunk: usize, byte_order: Endian) -> ChunkDecode {
        let (rows, width) = self.chunk_extent();
        ChunkDecode {
            page: self.number,
            chunk,
            tile: matches!(self.chunking, Chunking::Tiles { .. }),
            byte_order,
            compression: self.compression,
            predictor: self.predictor,
            dtype: self.dtype,
            samples: self.chunk_samples(),
            width,
            rows: self.chunk_rows(chunk),
            padded_rows: rows,
        }
    }
}

/// A TIFF file's pages, in order, and the file's byte order and length.
pub struct TiffFile {
    pub pages: Vec<Page>,
    pub byte_order: Endian,
    pub len: u64,
}

/// Reads every page directory of the TIFF file at `path`. Refused, naming
/// the file and page: what is not TIFF, a directory that cannot be parsed
/// (a truncated file), and pages rechunkfs cannot read in place or decode
/// (see [`read_page`]).
pub fn read_file(path: &Path) -> Result<TiffFile> {
    let file = crate::sys::files::open_regular(path)?;
    let len = file
        .metadata()
        .map_err(|e| Error::io(path, "stat", e))?
        .len();
    let mut limits = Limits::default();
    limits.ifd_value_size = MAX_TAG_BYTES;
    let mut decoder = Decoder::new(BufReader::new(file))
        .map_err(|e| bad(path, directory_problem(&e, 0)))?
        .with_limits(limits);
    let byte_order = match decoder.byte_order() {
        ByteOrder::LittleEndian => Endian::Little,
        ByteOrder::BigEndian => Endian::Big,
    };
    let mut pages = Vec::new();
    let mut reduced = Vec::new();
    for number in 0.. {
        if is_reduced(&mut decoder).map_err(|e| bad(path, directory_problem(&e, number)))? {
            reduced.push(number);
        } else {
            pages.push(read_page(&mut decoder, path, number, byte_order)?);
        }
        if !decoder.more_images() {
            break;
        }
        if number + 1 == MAX_PAGES {
            return Err(bad(
                path,
                format!("it has more than {MAX_PAGES} pages, more than rechunkfs lists"),
            ));
        }
        decoder
            .next_image()
            .map_err(|e| bad(path, directory_problem(&e, number + 1)))?;
    }
    if pages.is_empty() {
        return Err(bad(
            path,
            "every page is a reduced-resolution copy (a thumbnail or pyramid level) of an image \
             the file does not hold",
        ));
    }
    if !reduced.is_empty() {
        log::info!(
            "{}: pages {reduced:?} are reduced-resolution copies (NewSubfileType), left out as \
             tifffile leaves them out",
            path.display()
        );
    }
    Ok(TiffFile {
        pages,
        byte_order,
        len,
    })
}

/// Whether the current page is a reduced-resolution copy of another
/// (a thumbnail or a pyramid level: bit 0 of NewSubfileType).
fn is_reduced<R: Read + Seek>(decoder: &mut Decoder<R>) -> tiff::TiffResult<bool> {
    let kind = decoder.find_tag_unsigned::<u64>(Tag::NewSubfileType)?;
    Ok(kind.unwrap_or(0) & 1 == 1)
}

/// What is wrong with page `page`'s directory, from the crate's error.
fn directory_problem(error: &tiff::TiffError, page: usize) -> String {
    match error {
        tiff::TiffError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => format!(
            "the file ends inside the directory of page {page}: it is truncated; copy it again \
             from its source"
        ),
        other => format!("page {page}: cannot read its directory: {other}"),
    }
}

/// The page the decoder is at, checked to be one rechunkfs reads: samples
/// of 8, 16, 32 or 64 bits (unsigned, signed or float), with a compression
/// it decodes.
fn read_page<R: Read + Seek>(
    decoder: &mut Decoder<R>,
    path: &Path,
    number: usize,
    byte_order: Endian,
) -> Result<Page> {
    let (width, height) = decoder
        .dimensions()
        .map_err(|e| bad(path, directory_problem(&e, number)))?;
    let at_page = format!("page {number}");
    let coding = read_coding(decoder, path, number)?;
    let dtype = page_dtype(decoder, path, &at_page, byte_order)?;
    let (chunking, offsets, byte_counts) = page_chunks(decoder, path, number)?;
    let page = Page {
        number,
        width: width.into(),
        height: height.into(),
        samples: coding.samples,
        planar: coding.planar,
        dtype,
        compression: coding.compression,
        predictor: coding.predictor,
        chunking,
        offsets,
        byte_counts,
    };
    check_layout(&page).map_err(|problem| bad(path, format!("{at_page}: {problem}")))?;
    Ok(page)
}

/// How a page's samples are laid out and encoded.
struct Coding {
    samples: u64,
    planar: bool,
    compression: u16,
    predictor: u16,
}

/// The page's coding, refused unless rechunkfs reads it: a compression
/// and predictor it decodes, a 2-D page.
fn read_coding<R: Read + Seek>(
    decoder: &mut Decoder<R>,
    path: &Path,
    number: usize,
) -> Result<Coding> {
    let mut tag = |tag: Tag| -> Result<u64> {
        Ok(decoder
            .find_tag_unsigned::<u64>(tag)
            .map_err(|e| bad(path, directory_problem(&e, number)))?
            .unwrap_or(1))
    };
    let (samples, planar, depth) = (
        tag(Tag::SamplesPerPixel)?,
        tag(Tag::PlanarConfiguration)?,
        tag(Tag::Unknown(IMAGE_DEPTH))?,
    );
    let (compression, predictor) = (tag(Tag::Compression)?, tag(Tag::Predictor)?);
    let refuse = |problem: String| Err(bad(path, format!("page {number} {problem}")));
    if !matches!(planar, 1 | 2) {
        return refuse(format!(
            "has PlanarConfiguration {planar}, which TIFF does not define"
        ));
    }
    let Some(compression) = u16::try_from(compression)
        .ok()
        .filter(|&c| compression_name(c).is_some())
    else {
        return refuse(format!(
            "is compressed with scheme {compression}{}, which rechunkfs does not decode; it \
             reads uncompressed, LZW, deflate, PackBits and zstd pages: rewrite the file with \
             one of them (tifffile: compression='zlib')",
            known_scheme(compression)
        ));
    };
    if !matches!(predictor, 1..=3) {
        return refuse(format!(
            "has predictor {predictor}, which TIFF does not define"
        ));
    }
    if depth != 1 {
        return refuse(format!(
            "is a volume of depth {depth} (SGI ImageDepth); rechunkfs reads 2-D pages: rewrite \
             it as one page per slice (tifffile: volumetric=False)"
        ));
    }
    Ok(Coding {
        samples,
        planar: samples > 1 && planar == 2,
        compression,
        predictor: predictor as u16,
    })
}

/// The problem with a page's sizes, if any: a page or a chunk too large
/// to count in bytes, or strip and tile tables that do not cover the page.
fn check_layout(page: &Page) -> std::result::Result<(), String> {
    crate::format::block::shape_problem(&page.shape(), page.dtype)?;
    let (rows, width) = page.chunk_extent();
    let chunk_bytes = [rows, width, page.pixel_bytes()]
        .iter()
        .try_fold(1u64, |bytes, &n| bytes.checked_mul(n));
    if chunk_bytes.is_none() {
        return Err(format!(
            "its {rows}×{width} strips or tiles are too large to count"
        ));
    }
    let planes = if page.planar { page.samples } else { 1 };
    let chunks = page.chunks_per_plane() * planes;
    let (offsets, counts) = (page.offsets.len() as u64, page.byte_counts.len() as u64);
    if offsets != chunks || counts != chunks {
        return Err(format!(
            "it lists {offsets} offsets and {counts} byte counts where its {} needs {chunks}",
            page.layout_text()
        ));
    }
    Ok(())
}

/// Names of compression schemes refused, to say which one a file uses.
fn known_scheme(code: u64) -> &'static str {
    match code {
        2..=4 => " (CCITT fax)",
        6 | 7 => " (JPEG)",
        34712 => " (JPEG 2000)",
        34887 => " (LERC)",
        34925 | 34926 => " (LZMA)",
        34933 => " (PNG)",
        50001 => " (WebP)",
        50002 => " (JPEG XL)",
        _ => "",
    }
}

/// The page's sample type: every sample alike, 8 to 64 bits.
fn page_dtype<R: Read + Seek>(
    decoder: &mut Decoder<R>,
    path: &Path,
    at_page: &str,
    byte_order: Endian,
) -> Result<DType> {
    let tag_error = |e: tiff::TiffError| bad(path, format!("{at_page}: {e}"));
    let bits: Vec<u64> = decoder
        .find_tag_unsigned_vec(Tag::BitsPerSample)
        .map_err(tag_error)?
        .unwrap_or_else(|| vec![1]);
    let formats: Vec<u64> = decoder
        .find_tag_unsigned_vec(Tag::SampleFormat)
        .map_err(tag_error)?
        .unwrap_or_else(|| vec![1]);
    let (Some(&bits_0), Some(&format_0)) = (bits.first(), formats.first()) else {
        return Err(bad(
            path,
            format!("{at_page}: an empty BitsPerSample or SampleFormat"),
        ));
    };
    if bits.iter().any(|&b| b != bits_0) || formats.iter().any(|&f| f != format_0) {
        return Err(bad(
            path,
            format!(
                "{at_page} mixes sample types (bits {bits:?}, formats {formats:?}); rechunkfs \
                 carries one type per array"
            ),
        ));
    }
    let kind = match format_0 {
        1 | 4 => Kind::Unsigned,
        2 => Kind::Signed,
        3 => Kind::Float,
        other => {
            return Err(bad(
                path,
                format!(
                    "{at_page} has SampleFormat {other} (complex or unknown); rechunkfs carries \
                     integers and floats"
                ),
            ))
        }
    };
    if !matches!(bits_0, 8 | 16 | 32 | 64) {
        return Err(bad(
            path,
            format!(
                "{at_page} has {bits_0}-bit samples; rechunkfs carries samples of 8, 16, 32 or 64 \
                 bits: rewrite it with a wider type"
            ),
        ));
    }
    DType::new(kind, bits_0 as usize / 8, byte_order)
        .map_err(|e| bad(path, format!("{at_page}: {e}")))
}

/// How the page is cut, and where its strips or tiles are.
fn page_chunks<R: Read + Seek>(
    decoder: &mut Decoder<R>,
    path: &Path,
    number: usize,
) -> Result<(Chunking, Vec<u64>, Vec<u64>)> {
    let tag_error = |e: tiff::TiffError| bad(path, directory_problem(&e, number));
    let tiles = decoder
        .find_tag_unsigned::<u64>(Tag::TileWidth)
        .map_err(tag_error)?;
    let (chunking, offsets_tag, counts_tag) = match tiles {
        Some(width) => {
            let length = decoder
                .find_tag_unsigned::<u64>(Tag::TileLength)
                .map_err(tag_error)?
                .unwrap_or(0);
            (
                Chunking::Tiles { width, length },
                Tag::TileOffsets,
                Tag::TileByteCounts,
            )
        }
        None => {
            let rows = decoder
                .find_tag_unsigned::<u64>(Tag::RowsPerStrip)
                .map_err(tag_error)?
                .unwrap_or(u32::MAX.into());
            (
                Chunking::Strips { rows },
                Tag::StripOffsets,
                Tag::StripByteCounts,
            )
        }
    };
    if matches!(
        chunking,
        Chunking::Tiles { width: 0, .. }
            | Chunking::Tiles { length: 0, .. }
            | Chunking::Strips { rows: 0 }
    ) {
        return Err(bad(
            path,
            format!("page {number} has strips or tiles of no rows or columns"),
        ));
    }
    let offsets = decoder.get_tag_u64_vec(offsets_tag).map_err(tag_error)?;
    let counts = decoder.get_tag_u64_vec(counts_tag).map_err(tag_error)?;
    Ok((chunking, offsets, counts))
}

/// Whether `path` names a TIFF file by its extension (`.tif`, `.tiff`).
pub fn is_tiff_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("tif") || e.eq_ignore_ascii_case("tiff"))
}

/// TIFF's row of the format table: read only, each file a whole array
/// read page by page.
pub(in crate::format) const TRAITS: FormatTraits = FormatTraits {
    name: NAME,
    extension: "tif",
    input_extensions: &["tif", "tiff"],
    probe: Err("a TIFF file is read page by page as a whole array, not as one block of a grid"),
    whole_file: true,
    template: Err(
        "rechunkfs reads TIFF but does not write it; choose --format h5, npy, nii, raw, zarr \
         or zarr3",
    ),
    ..FormatTraits::NONE
};
