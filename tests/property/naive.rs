//! The naive reference: what every element of the array holds, and which
//! elements each block file holds, by plain index arithmetic over C-order
//! odometers. Nothing here comes from rechunkfs: the point is that a bug in
//! its geometry cannot be mirrored by the expectation it is checked against.

use std::fmt;

/// A numeric element type as numpy spells it: kind, width, byte order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Elem {
    /// `u`, `i` or `f`.
    pub kind: char,
    pub size: usize,
    /// Stored most significant byte first (only for `size > 1`).
    pub big: bool,
}

impl Elem {
    /// Every numeric type, each multi-byte one in both byte orders.
    pub fn all() -> Vec<Elem> {
        let mut all = Vec::new();
        for (kind, size) in [
            ('u', 1),
            ('i', 1),
            ('u', 2),
            ('i', 2),
            ('u', 4),
            ('i', 4),
            ('u', 8),
            ('i', 8),
            ('f', 2),
            ('f', 4),
            ('f', 8),
        ] {
            all.push(Elem {
                kind,
                size,
                big: false,
            });
            if size > 1 {
                all.push(Elem {
                    kind,
                    size,
                    big: true,
                });
            }
        }
        all
    }

    /// numpy's `descr`: `|u1`, `<i4`, `>f2`.
    pub fn descr(&self) -> String {
        let order = match (self.size, self.big) {
            (1, _) => '|',
            (_, false) => '<',
            (_, true) => '>',
        };
        format!("{order}{}{}", self.kind, self.size)
    }

    /// Zarr v3's `data_type` name (the byte order goes in the `bytes` codec).
    pub fn zarr3_name(&self) -> String {
        let kind = match self.kind {
            'u' => "uint",
            'i' => "int",
            _ => "float",
        };
        format!("{kind}{}", self.size * 8)
    }

    /// The bytes stored for an element whose bit pattern is the low
    /// `size` bytes of `bits`, in this type's byte order.
    pub fn store(&self, bits: u64, out: &mut Vec<u8>) {
        let little = bits.to_le_bytes();
        if self.big {
            out.extend(little[..self.size].iter().rev());
        } else {
            out.extend_from_slice(&little[..self.size]);
        }
    }

    /// The bit pattern of an element from its stored bytes, read in byte
    /// order `big` (what the file's own header declares).
    pub fn load(&self, bytes: &[u8], big: bool) -> u64 {
        let mut little = [0u8; 8];
        if big {
            for (to, from) in little.iter_mut().zip(bytes.iter().rev()) {
                *to = *from;
            }
        } else {
            little[..self.size].copy_from_slice(bytes);
        }
        u64::from_le_bytes(little)
    }
}

impl fmt::Debug for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.descr())
    }
}

/// The splitmix64 finaliser: distinct, well-mixed bits for each index.
pub fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The bit pattern of the element at C-order linear index `n` of the
/// whole array (its low `size` bytes are the element).
pub fn element_bits(n: u64, elem: Elem) -> u64 {
    let bits = splitmix64(n);
    if elem.size == 8 {
        bits
    } else {
        bits & ((1u64 << (8 * elem.size)) - 1)
    }
}

/// Every index of a box of `shape`, in C order (the last index fastest).
pub fn odometer(shape: &[u64]) -> impl Iterator<Item = Vec<u64>> + '_ {
    let mut next = if shape.contains(&0) {
        None
    } else {
        Some(vec![0u64; shape.len()])
    };
    std::iter::from_fn(move || {
        let current = next.clone()?;
        let mut index = current.clone();
        let mut axis = shape.len();
        loop {
            if axis == 0 {
                next = None;
                break;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < shape[axis] {
                next = Some(index);
                break;
            }
            index[axis] = 0;
        }
        Some(current)
    })
}

/// The whole array's stored bytes in C order, element by element.
pub fn whole_array(array: &[u64], elem: Elem) -> Vec<u8> {
    let mut bytes = Vec::new();
    for (n, _) in odometer(array).enumerate() {
        elem.store(element_bits(n as u64, elem), &mut bytes);
    }
    bytes
}

/// One block of a regular grid: its grid index, first element and sides.
#[derive(Clone, Debug)]
pub struct Block {
    pub index: Vec<u64>,
    pub origin: Vec<u64>,
    pub shape: Vec<u64>,
}

/// The blocks of `array` cut into blocks of `block` (a side past the
/// array is the whole side), in C order of their grid index; edge blocks
/// are cut short.
pub fn blocks(array: &[u64], block: &[u64]) -> Vec<Block> {
    let side: Vec<u64> = block.iter().zip(array).map(|(&b, &a)| b.min(a)).collect();
    let counts: Vec<u64> = array
        .iter()
        .zip(&side)
        .map(|(&a, &b)| a.div_ceil(b))
        .collect();
    odometer(&counts)
        .map(|index| {
            let origin: Vec<u64> = index.iter().zip(&side).map(|(&i, &b)| i * b).collect();
            let shape = origin
                .iter()
                .zip(&side)
                .zip(array)
                .map(|((&o, &b), &a)| b.min(a - o))
                .collect();
            Block {
                index,
                origin,
                shape,
            }
        })
        .collect()
}

/// The stored bytes of `block` of the whole array `whole` (of shape
/// `array`), laid out as a C-order box of `file_shape` (at least the
/// block's shape; Zarr chunks are padded to it) with `pad` in every byte
/// outside the array.
pub fn cut(
    whole: &[u8],
    array: &[u64],
    block: &Block,
    file_shape: &[u64],
    elem: Elem,
    pad: u8,
) -> Vec<u8> {
    let size = elem.size;
    let mut bytes = Vec::with_capacity(file_shape.iter().product::<u64>() as usize * size);
    for local in odometer(file_shape) {
        let inside = local.iter().zip(&block.shape).all(|(&l, &s)| l < s);
        if !inside {
            bytes.extend(std::iter::repeat_n(pad, size));
            continue;
        }
        let mut n = 0u64;
        for axis in 0..array.len() {
            n = n * array[axis] + block.origin[axis] + local[axis];
        }
        let at = n as usize * size;
        bytes.extend_from_slice(&whole[at..at + size]);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odometer_counts_in_c_order() {
        let all: Vec<Vec<u64>> = odometer(&[2, 3]).collect();
        assert_eq!(
            all,
            [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]].map(|a| a.to_vec())
        );
        assert_eq!(odometer(&[1, 1, 1]).count(), 1);
    }

    #[test]
    fn blocks_cover_the_array_once() {
        let found = blocks(&[5, 4], &[2, 9]);
        let origins: Vec<Vec<u64>> = found.iter().map(|b| b.origin.clone()).collect();
        assert_eq!(origins, [[0, 0], [2, 0], [4, 0]].map(|a| a.to_vec()));
        assert_eq!(found[2].shape, [1, 4]);
    }

    #[test]
    fn cut_pads_outside_the_array() {
        let elem = Elem {
            kind: 'u',
            size: 1,
            big: false,
        };
        let whole: Vec<u8> = (0..6).collect();
        let block = Block {
            index: vec![1, 0],
            origin: vec![1, 0],
            shape: vec![1, 3],
        };
        assert_eq!(
            cut(&whole, &[2, 3], &block, &[2, 4], elem, 9),
            [3, 4, 5, 9, 9, 9, 9, 9]
        );
    }

    #[test]
    fn byte_orders_store_and_load() {
        let big = Elem {
            kind: 'u',
            size: 2,
            big: true,
        };
        let mut out = Vec::new();
        big.store(0x0102, &mut out);
        assert_eq!(out, [1, 2]);
        assert_eq!(big.load(&out, true), 0x0102);
    }
}
