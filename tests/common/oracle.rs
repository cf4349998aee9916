//! What the tests hold rechunkfs's output to, computed without any of its
//! code: the sample array's bytes (element `n` in C order is the first
//! bytes of `splitmix64(n)`, little-endian, as `rechunkfs sample` defines
//! it) and the blocks of a regular grid, by plain loops.

/// `splitmix64`, as the sample array's definition gives it.
pub fn splitmix64(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One block of a regular grid: its index, first element and shape.
#[derive(Clone, Debug)]
pub struct GridBlock {
    pub index: Vec<u64>,
    pub origin: Vec<u64>,
    pub shape: Vec<u64>,
}

impl GridBlock {
    /// Its file name stem in C order: `i_j_k`.
    pub fn stem(&self) -> String {
        let parts: Vec<String> = self.index.iter().map(u64::to_string).collect();
        parts.join("_")
    }
}

/// Every block of `array` cut in blocks of `block` (a side past the array
/// means the whole side), in C order of their indices; edge blocks are
/// smaller.
pub fn grid_blocks(array: &[u64], block: &[u64]) -> Vec<GridBlock> {
    let block: Vec<u64> = block.iter().zip(array).map(|(b, a)| (*b).min(*a)).collect();
    let grid: Vec<u64> = array
        .iter()
        .zip(&block)
        .map(|(a, b)| a.div_ceil(*b))
        .collect();
    let mut index = vec![0u64; array.len()];
    let mut blocks = Vec::new();
    loop {
        let origin: Vec<u64> = index.iter().zip(&block).map(|(i, b)| i * b).collect();
        let shape = origin
            .iter()
            .zip(&block)
            .zip(array)
            .map(|((o, b), a)| (*b).min(a - o))
            .collect();
        blocks.push(GridBlock {
            index: index.clone(),
            origin,
            shape,
        });
        let mut d = array.len();
        loop {
            if d == 0 {
                return blocks;
            }
            d -= 1;
            index[d] += 1;
            if index[d] < grid[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// The C-order bytes of the box of the sample array at `origin` with
/// `shape`, `elem` bytes an element: an odometer over the box, each
/// element at its linear index in the whole array.
pub fn sample_bytes(array: &[u64], origin: &[u64], shape: &[u64], elem: usize) -> Vec<u8> {
    let count: u64 = shape.iter().product();
    let mut bytes = Vec::with_capacity(count as usize * elem);
    let mut at = vec![0u64; shape.len()];
    for _ in 0..count {
        let mut linear = 0u64;
        for d in 0..array.len() {
            linear = linear * array[d] + origin[d] + at[d];
        }
        bytes.extend_from_slice(&splitmix64(linear).to_le_bytes()[..elem]);
        for d in (0..shape.len()).rev() {
            at[d] += 1;
            if at[d] < shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
    bytes
}

/// `data` (C order, `shape`) placed at the start of each axis of a zeroed
/// box of `padded`: a Zarr edge chunk, whose fill value is 0.
pub fn padded(data: &[u8], shape: &[u64], padded: &[u64], elem: usize) -> Vec<u8> {
    let total: u64 = padded.iter().product();
    let mut out = vec![0u8; total as usize * elem];
    let count: u64 = shape.iter().product();
    let mut at = vec![0u64; shape.len()];
    for i in 0..count as usize {
        let mut linear = 0u64;
        for d in 0..shape.len() {
            linear = linear * padded[d] + at[d];
        }
        let to = linear as usize * elem;
        out[to..to + elem].copy_from_slice(&data[i * elem..(i + 1) * elem]);
        for d in (0..shape.len()).rev() {
            at[d] += 1;
            if at[d] < shape[d] {
                break;
            }
            at[d] = 0;
        }
    }
    out
}
