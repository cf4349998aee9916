//! libhdf5's deflate filter, replaced by one whose inflation is bounded by
//! the chunk being read.
//!
//! libhdf5 inflates a chunk into a buffer it doubles until the stream
//! ends, and only then compares the result with the chunk's size: a chunk
//! of a few hundred kilobytes that inflates to gigabytes takes that much
//! memory first. The filter registered here (under deflate's own id, so
//! it serves every dataset, read or written) inflates into at most the
//! bytes set by [`bounded`] around a read, the chunk's size, and fails
//! the read past them, telling the reader why. Deflating is zlib's, as
//! before.
//!
//! The public `H5Zregister` refuses to replace a predefined filter, so
//! the library's own `H5Z_register` does it: libhdf5 is built from source
//! and linked in statically (Cargo.toml), so that symbol is this build's.

use std::io::Write;
use std::os::raw::{c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

use hdf5_sys::h5::{herr_t, H5allocate_memory, H5free_memory, H5open};
use hdf5_sys::h5z::{H5Z_class2_t, H5Z_CLASS_T_VERS, H5Z_FILTER_DEFLATE, H5Z_FLAG_REVERSE};

extern "C" {
    /// libhdf5's internal registration, which may replace a predefined
    /// filter (H5Z.c; the public H5Zregister checks the id, then calls it).
    fn H5Z_register(cls: *const H5Z_class2_t) -> herr_t;
}

use super::decode::{read_limited, Overrun};

/// The most bytes a chunk may inflate to; `u64::MAX` outside [`bounded`].
static LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Whether the last bounded read failed because a chunk inflated past it.
static OVERRAN: AtomicBool = AtomicBool::new(false);

static REGISTER: Once = Once::new();

/// Registers the filter, once. The caller holds the library's lock.
pub(super) fn register() {
    REGISTER.call_once(|| {
        let class = H5Z_class2_t {
            version: H5Z_CLASS_T_VERS as _,
            id: H5Z_FILTER_DEFLATE,
            encoder_present: 1,
            decoder_present: 1,
            name: c"deflate, bounded by the chunk (rechunkfs)".as_ptr(),
            can_apply: None,
            set_local: None,
            filter: Some(filter),
        };
        // SAFETY: the library is initialised first; `class` is a complete
        // H5Z_class2_t, which libhdf5 copies; its name is a static string.
        // A failure leaves libhdf5's own filter in place, as before.
        unsafe {
            H5open();
            H5Z_register(&class);
        }
    });
}

/// Runs `read` (under the library's lock) with chunks inflating to at most
/// `limit` bytes; whether one went past them.
pub(super) fn bounded<T>(limit: u64, read: impl FnOnce() -> T) -> (T, bool) {
    register();
    OVERRAN.store(false, Ordering::SeqCst);
    LIMIT.store(limit, Ordering::SeqCst);
    let result = read();
    LIMIT.store(u64::MAX, Ordering::SeqCst);
    (result, OVERRAN.swap(false, Ordering::SeqCst))
}

/// The bytes a chunk of `chunk_bytes` may inflate to: its size, and room
/// for what filters applied before deflate add (scale-offset's header).
pub(super) fn chunk_limit(chunk_bytes: u64) -> u64 {
    chunk_bytes
        .saturating_add(chunk_bytes / 64)
        .saturating_add(4 << 10)
}

/// The filter: inflates (`H5Z_FLAG_REVERSE`) or deflates the `nbytes` at
/// `*buf`, replacing the buffer; 0 is failure.
unsafe extern "C" fn filter(
    flags: c_uint,
    cd_nelmts: usize,
    cd_values: *const c_uint,
    nbytes: usize,
    buf_size: *mut usize,
    buf: *mut *mut c_void,
) -> usize {
    // SAFETY: libhdf5 passes its buffer of at least `nbytes` bytes.
    let input = unsafe { std::slice::from_raw_parts(*buf as *const u8, nbytes) };
    let output = if flags & H5Z_FLAG_REVERSE != 0 {
        let limit = LIMIT.load(Ordering::SeqCst);
        let mut out = Vec::new();
        let room = if limit == u64::MAX {
            nbytes.saturating_mul(4)
        } else {
            limit as usize
        };
        if out.try_reserve_exact(room).is_err() {
            return 0;
        }
        match read_limited(flate2::read::ZlibDecoder::new(input), limit, out) {
            Ok(out) => out,
            Err(Overrun::Longer { .. }) => {
                OVERRAN.store(true, Ordering::SeqCst);
                return 0;
            }
            Err(_) => return 0,
        }
    } else {
        let level = if cd_nelmts > 0 && !cd_values.is_null() {
            // SAFETY: libhdf5 passes `cd_nelmts` values.
            unsafe { *cd_values }.min(9)
        } else {
            6
        };
        let mut encoder =
            flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(level));
        match encoder.write_all(input).and_then(|_| encoder.finish()) {
            Ok(out) => out,
            Err(_) => return 0,
        }
    };
    if output.is_empty() {
        return 0;
    }
    // SAFETY: libhdf5 frees filter buffers with its own allocator, which
    // H5allocate_memory is; the old buffer is libhdf5's and no longer used.
    unsafe {
        let new = H5allocate_memory(output.len(), 0) as *mut u8;
        if new.is_null() {
            return 0;
        }
        std::ptr::copy_nonoverlapping(output.as_ptr(), new, output.len());
        H5free_memory(*buf);
        *buf = new as *mut c_void;
        *buf_size = output.len();
    }
    output.len()
}
