//! Gzipped NIfTI (`.nii.gz`): a file is one gzip stream (or several
//! members one after another, as `cat a.gz b.gz` makes), so its voxels are
//! at no fixed offset and it can only be read whole. Probing inflates just
//! the header; reading is one call for the whole file, inflated by
//! [`GzippedNifti`] into the block's bytes after `vox_offset`.

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use flate2::bufread::MultiGzDecoder;

use crate::error::{Error, Result};
use crate::format::block::{shape_text, Storage};
use crate::format::decode::{check_holds, most_at_ratio, reserved, BlockDecode, DEFLATE_RATIO};

/// How [`crate::error::Error::BadBlockFile`] names the format.
pub(super) const FORMAT: &str = "gzipped NIfTI";

/// Compressed bytes read at a time while probing: enough for the header
/// to inflate from, not the whole file.
const PROBE_BUFFER: usize = 4 << 10;

/// Whether `head` (a file's first bytes) starts a gzip stream.
pub(super) fn is_gzip(head: &[u8]) -> bool {
    head.starts_with(&[0x1f, 0x8b])
}

/// The first `up_to` bytes (fewer if the stream is shorter) the gzipped
/// file `path` (open as `file`, at its start) inflates to: its header,
/// inflating nothing past it.
pub(super) fn inflate_head(path: &Path, file: File, up_to: u64) -> Result<Vec<u8>> {
    let mut stream = MultiGzDecoder::new(BufReader::with_capacity(PROBE_BUFFER, file)).take(up_to);
    let mut head = Vec::with_capacity(up_to as usize);
    stream
        .read_to_end(&mut head)
        .map_err(|e| damaged(path, "its header", &e))?;
    Ok(head)
}

/// The storage of the gzipped NIfTI file `path` (`file_len` bytes) whose
/// header puts `data_len` bytes of an image of `dims` (x, y, z order) at
/// `vox_offset` of the inflated stream. A file too short to inflate to
/// that, even at deflate's greatest ratio, is refused.
pub(super) fn storage(
    path: &Path,
    file_len: u64,
    vox_offset: u64,
    data_len: u64,
    dims: Vec<u64>,
) -> Result<Storage> {
    let decoder = GzippedNifti {
        vox_offset,
        data_len,
        dims,
    };
    check_holds(&decoder, path, file_len)?;
    Ok(Storage::Encoded {
        decoder: Arc::new(decoder),
        offset: 0,
        len: file_len,
    })
}

/// The error for a gzip stream that does not inflate.
fn damaged(path: &Path, part: &str, error: &io::Error) -> Error {
    Error::BadBlockFile {
        path: path.to_path_buf(),
        format: FORMAT,
        problem: format!(
            "the gzip stream is damaged where {part} should be ({error}); the file is corrupt \
             or was cut short: copy it again, or check it with `gzip -t`"
        ),
    }
}

/// Inflates one gzipped NIfTI file into the `data_len` bytes of its block
/// after its `vox_offset`: the header and any extensions are inflated and
/// dropped, and the stream must end, its checksum right, just after the data.
pub struct GzippedNifti {
    vox_offset: u64,
    data_len: u64,
    /// The sides, (x, y, z) order, for messages.
    dims: Vec<u64>,
}

impl GzippedNifti {
    /// The error for a stream that inflates to `inflated` bytes where
    /// `vox_offset + data_len` were promised.
    fn wrong_length(&self, path: &Path, inflated: &str) -> Error {
        Error::BadBlockFile {
            path: path.to_path_buf(),
            format: FORMAT,
            problem: format!(
                "it inflates to {inflated} bytes, but its header promises {} voxels (x, y, z \
                 order) = {} data bytes from offset {}, {} in all; the file is damaged or was \
                 cut short",
                shape_text(&self.dims),
                self.data_len,
                self.vox_offset,
                self.vox_offset + self.data_len
            ),
        }
    }
}

impl BlockDecode for GzippedNifti {
    fn decode(&self, path: &Path, encoded: &[u8]) -> Result<Vec<u8>> {
        let mut stream = MultiGzDecoder::new(encoded);
        let skipped = io::copy(&mut (&mut stream).take(self.vox_offset), &mut io::sink())
            .map_err(|e| damaged(path, "the header", &e))?;
        if skipped < self.vox_offset {
            return Err(self.wrong_length(path, &skipped.to_string()));
        }
        let mut data = reserved(path, self.data_len)?;
        let read = (&mut stream)
            .take(self.data_len)
            .read_to_end(&mut data)
            .map_err(|e| damaged(path, "the voxels", &e))?;
        if read as u64 != self.data_len {
            return Err(self.wrong_length(path, &(self.vox_offset + read as u64).to_string()));
        }
        // Reading on to the end checks each member's length and checksum.
        let mut beyond = [0u8; 1];
        match stream.read(&mut beyond) {
            Ok(0) => Ok(data),
            Ok(_) => Err(self.wrong_length(
                path,
                &format!("more than {}", self.vox_offset + self.data_len),
            )),
            Err(e) => Err(damaged(path, "the end of the stream", &e)),
        }
    }

    fn decoded_len(&self) -> u64 {
        self.data_len
    }

    /// The header and the voxels are all inflated from the file.
    fn claimed_len(&self) -> u64 {
        self.vox_offset.saturating_add(self.data_len)
    }

    fn most_decoded(&self, encoded_len: u64) -> Option<u64> {
        Some(most_at_ratio(encoded_len, DEFLATE_RATIO))
    }

    fn describe(&self) -> String {
        format!("gzip, data from byte {}", self.vox_offset)
    }
}

impl fmt::Debug for GzippedNifti {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GzippedNifti({} data bytes from {})",
            self.data_len, self.vox_offset
        )
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::write::GzEncoder;
    use flate2::Compression;

    use super::*;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    fn decoder() -> GzippedNifti {
        GzippedNifti {
            vox_offset: 4,
            data_len: 6,
            dims: vec![6],
        }
    }

    #[test]
    fn members_one_after_another_inflate_as_one_stream() {
        let path = Path::new("x.nii.gz");
        let mut two = gzip(b"headab");
        two.extend(gzip(b"cdef"));
        assert_eq!(decoder().decode(path, &two).unwrap(), b"abcdef");
        assert_eq!(
            decoder().decode(path, &gzip(b"headabcdef")).unwrap(),
            b"abcdef"
        );
    }

    #[test]
    fn probing_inflates_the_header_only() {
        use crate::array::space::Space;
        let dtype = "<i2".parse().unwrap();
        let shape = [40, 50, 60];
        let mut image = super::super::encode_header(
            super::super::Version::Two,
            &shape,
            dtype,
            &Space::identity(3),
            &[0, 0, 0],
            544,
        );
        image.extend((0..40 * 50 * 60 * 2).map(|i| (i * 7 % 251) as u8));
        let whole = gzip(&image);
        // Cut well past the header: probing never gets that far, reading does.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0_0_0.nii.gz");
        std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
        let (header, data_len, storage) = super::super::read_file_header(&path).unwrap();
        assert_eq!(header.dims, [60, 50, 40]);
        assert_eq!(data_len, 40 * 50 * 60 * 2);
        let Storage::Encoded { decoder, .. } = storage else {
            panic!("a gzipped file is read whole and decoded");
        };
        assert_eq!(decoder.decoded_len(), data_len);
        let error = decoder
            .decode(&path, &whole[..whole.len() / 2])
            .unwrap_err();
        assert!(error.to_string().contains("damaged"), "{error}");
        assert_eq!(decoder.decode(&path, &whole).unwrap(), &image[544..]);
    }

    #[test]
    fn damaged_streams_are_errors_naming_the_file() {
        let path = Path::new("x.nii.gz");
        let whole = gzip(b"headabcdef");
        let cut = &whole[..whole.len() - 6];
        let mut flipped = whole.clone();
        let at = flipped.len() - 9;
        flipped[at] ^= 0x55;
        for (bytes, expected) in [
            (cut, "damaged"),
            (&flipped[..], "damaged"),
            (&gzip(b"headabc")[..], "inflates to 7 bytes"),
            (&gzip(b"headabcdefg")[..], "more than 10"),
            (&whole[..5], "damaged"),
        ] {
            let error = decoder().decode(path, bytes).unwrap_err().to_string();
            assert!(
                error.contains("x.nii.gz") && error.contains(expected),
                "{error}"
            );
        }
    }
}
