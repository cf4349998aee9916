//! Read-ahead across block files. The kernel reads ahead within a file, but
//! a tool reading every block of a view opens one file after another, and
//! on a cold cache the disk then serves one small file at a time: W1's
//! 2,744 staged blocks of 250 KB read at 540–770 MB/s that way, and at
//! 1,350 MB/s with the next four files advised ahead of the reader.
//!
//! [`Sweeps`] recognises a reader opening blocks in order — name order, as
//! `ls` and sorted globs list them, or grid order, as the view's directory
//! does — once it has opened two consecutive blocks, and names the next few
//! blocks of that order. A tiled viewer opening blocks here and there never
//! opens two consecutive ones, so it costs no read-ahead.

/// How many readers sweeping at once are followed.
const STREAMS: usize = 4;

/// Name order is tabulated up to this many blocks: 8 bytes a block, and
/// the names (about 36 bytes each) while sorting them, which counts in the
/// daemon's peak memory (1 << 20 blocks took 0.24 s and 36 MiB). Larger
/// grids are followed in grid order only.
const NAME_ORDER_MAX_BLOCKS: u64 = 1 << 18;

/// One order a sweep can follow.
enum Order {
    /// Grid (C) order: a block's position is its rank.
    Grid,
    /// Another order: `ranks[position]` and `positions[rank]`.
    Table {
        ranks: Vec<u32>,
        positions: Vec<u32>,
    },
}

impl Order {
    fn position(&self, rank: u64) -> u64 {
        match self {
            Order::Grid => rank,
            Order::Table { positions, .. } => positions[rank as usize] as u64,
        }
    }

    fn rank(&self, position: u64) -> u64 {
        match self {
            Order::Grid => position,
            Order::Table { ranks, .. } => ranks[position as usize] as u64,
        }
    }
}

/// A reader being followed.
#[derive(Clone, Debug)]
struct Stream {
    /// The block it opened last.
    last: u64,
    /// The orders every step so far has followed (one bit per order).
    orders: u32,
    /// Blocks named for read-ahead lately, so each is named once.
    named: std::collections::VecDeque<u64>,
}

/// Readers sweeping the blocks, and what to read ahead for them.
pub struct Sweeps {
    count: u64,
    orders: Vec<Order>,
    /// Most recently used last.
    streams: Vec<Stream>,
    ahead: u64,
}

impl Sweeps {
    /// Sweeps over `count` blocks named by `name`, reading `ahead` blocks
    /// ahead of a sweeping reader.
    pub fn new(count: u64, name: impl Fn(u64) -> String, ahead: u64) -> Sweeps {
        let mut orders = vec![Order::Grid];
        if count <= NAME_ORDER_MAX_BLOCKS {
            let mut ranks: Vec<u32> = (0..count as u32).collect();
            let names: Vec<String> = (0..count).map(&name).collect();
            ranks.sort_by(|&a, &b| names[a as usize].cmp(&names[b as usize]));
            if ranks.iter().enumerate().any(|(p, &r)| p as u32 != r) {
                let mut positions = vec![0u32; count as usize];
                for (position, &rank) in ranks.iter().enumerate() {
                    positions[rank as usize] = position as u32;
                }
                orders.push(Order::Table { ranks, positions });
            }
        }
        Sweeps {
            count,
            orders,
            streams: Vec::with_capacity(STREAMS + 1),
            ahead: ahead.max(1),
        }
    }

    /// Notes that block `rank` was opened; returns the blocks to read ahead
    /// for the sweep it continues (each named once per sweep), in order.
    pub fn opened(&mut self, rank: u64) -> Vec<u64> {
        if rank >= self.count {
            return Vec::new();
        }
        let continued = self.streams.iter().enumerate().find_map(|(i, stream)| {
            let follows = (0..self.orders.len())
                .filter(|&o| stream.orders & (1 << o) != 0)
                .filter(|&o| {
                    let order = &self.orders[o];
                    order.position(rank) == order.position(stream.last) + 1
                })
                .fold(0u32, |bits, o| bits | 1 << o);
            (follows != 0).then_some((i, follows))
        });
        let Some((i, orders)) = continued else {
            // Opening the block again (a header, then the data) changes nothing.
            if let Some(i) = self.streams.iter().position(|s| s.last == rank) {
                let stream = self.streams.remove(i);
                self.streams.push(stream);
                return Vec::new();
            }
            self.streams.push(Stream {
                last: rank,
                orders: (1 << self.orders.len()) - 1,
                named: Default::default(),
            });
            if self.streams.len() > STREAMS {
                self.streams.remove(0);
            }
            return Vec::new();
        };
        let mut stream = self.streams.remove(i);
        // Another reader that stopped here is now this sweep.
        self.streams.retain(|s| s.last != rank);
        stream.last = rank;
        stream.orders = orders;
        // While the steps fit several orders (0, 1 is both grid and name
        // order), the next blocks of each are named.
        let mut ahead = Vec::new();
        for (o, order) in self.orders.iter().enumerate() {
            if orders & (1 << o) == 0 {
                continue;
            }
            let position = order.position(rank);
            for next in position + 1..(position + 1 + self.ahead).min(self.count) {
                let next = order.rank(next);
                if !stream.named.contains(&next) && !ahead.contains(&next) {
                    ahead.push(next);
                }
            }
        }
        stream.named.extend(&ahead);
        let remembered = 2 * self.ahead as usize * self.orders.len();
        while stream.named.len() > remembered {
            stream.named.pop_front();
        }
        self.streams.push(stream);
        ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flat names of a 12-block grid, as the view names them.
    fn names(rank: u64) -> String {
        format!("0_0_{rank}.h5")
    }

    #[test]
    fn a_sweep_in_grid_order_is_read_ahead_once_per_block() {
        let mut sweeps = Sweeps::new(6, |r| format!("{r}.npy"), 2);
        assert_eq!(sweeps.opened(0), Vec::<u64>::new());
        assert_eq!(sweeps.opened(1), vec![2, 3]);
        assert_eq!(sweeps.opened(2), vec![4]);
        assert_eq!(sweeps.opened(2), Vec::<u64>::new(), "reopening");
        assert_eq!(sweeps.opened(3), vec![5]);
        assert_eq!(sweeps.opened(4), Vec::<u64>::new(), "the grid ends");
        assert_eq!(sweeps.opened(5), Vec::<u64>::new());
    }

    #[test]
    fn a_sweep_in_name_order_is_followed_across_the_digits() {
        // Sorted: 0, 1, 10, 11, 2, 3, ..., 9.
        let mut sweeps = Sweeps::new(12, names, 3);
        let order: Vec<u64> = {
            let mut ranks: Vec<u64> = (0..12).collect();
            ranks.sort_by_key(|&r| names(r));
            ranks
        };
        assert_eq!(order[..5], [0, 1, 10, 11, 2]);
        let mut named = Vec::new();
        for &rank in &order {
            named.extend(sweeps.opened(rank));
        }
        // Everything after the first two, each once, before it is opened:
        // 0, 1 is the start of both orders, so both are read ahead.
        assert_eq!(named, [2, 3, 4, 10, 11, 5, 6, 7, 8, 9]);
    }

    #[test]
    fn blocks_opened_here_and_there_are_not_read_ahead() {
        let mut viewer = Sweeps::new(1000, names, 4);
        for rank in [500, 100, 900, 300, 700, 42, 143, 44, 601, 7] {
            assert_eq!(viewer.opened(rank), Vec::<u64>::new(), "{rank}");
        }
        // 42 then 420 (name order) is a sweep, and so is 42 then 43 (grid order).
        assert_eq!(viewer.opened(42), Vec::<u64>::new());
        assert_eq!(viewer.opened(420), vec![421, 422, 423, 424]);
        let mut lister = Sweeps::new(1000, names, 4);
        assert_eq!(lister.opened(42), Vec::<u64>::new());
        assert_eq!(lister.opened(43), vec![44, 45, 46, 47]);
    }

    #[test]
    fn interleaved_sweeps_are_followed_apart() {
        let mut sweeps = Sweeps::new(200, |r| format!("{r:03}"), 2);
        let mut named = Vec::new();
        for step in 0..10 {
            named.extend(sweeps.opened(step));
            named.extend(sweeps.opened(100 + step));
        }
        let mut expected: Vec<u64> = (2..12).chain(102..112).collect();
        named.sort_unstable();
        expected.sort_unstable();
        assert_eq!(named, expected);
    }
}
