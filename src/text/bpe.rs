//! Byte-level BPE: GPT-2's byte-to-character map and the merge loop of `transformers`'
//! `GPT2Tokenizer.bpe` (which `Qwen2Tokenizer` copies), on token ids instead of strings.
//!
//! Contract: a [`Bpe`] is immutable once built; [`Bpe::encode_word`] appends to the caller's vector,
//! reuses the caller's [`Scratch`], never blocks and never panics. It runs in O(n log n) for a word of
//! n bytes, so hostile input (a megabyte without a space) cannot stall it.
//!
//! The reference loop: while the word has two symbols or more, take the adjacent pair with the
//! lowest merge rank, and merge every occurrence of it, left to right, without overlaps.
//! Short words run that loop as written; long ones run an equivalent one on a heap of pairs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// GPT-2's byte-to-character map: byte `b` is written as `byte_chars()[b]` in a byte-level vocabulary.
/// Printable Latin-1 bytes stand for themselves; the 68 others map to U+0100.. in byte order.
pub fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut chars = ['\0'; 256];
    let mut next = 0x100;
    for (b, slot) in (0u32..).zip(chars.iter_mut()) {
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        // All values are below U+0144, so the conversion cannot fail.
        *slot = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    chars
}

/// The inverse of [`byte_chars`]: the byte a character of the byte-level alphabet stands for.
#[derive(Clone, Debug)]
pub struct ByteDecoder {
    // The alphabet is U+0021..=U+0143, so a flat table indexed by code point is 324 entries.
    table: Vec<Option<u8>>,
}

impl ByteDecoder {
    /// Builds the table.
    pub fn new() -> ByteDecoder {
        let chars = byte_chars();
        let mut table = vec![None; 0x144];
        for (b, c) in (0u8..=255).zip(chars) {
            if let Some(slot) = table.get_mut(c as usize) {
                *slot = Some(b);
            }
        }
        ByteDecoder { table }
    }

    /// The byte `c` stands for, or `None` if `c` is not in the alphabet.
    pub fn byte(&self, c: char) -> Option<u8> {
        self.table.get(c as usize).copied().flatten()
    }
}

impl Default for ByteDecoder {
    fn default() -> Self {
        ByteDecoder::new()
    }
}

/// One merge: its rank (its line in `merges.txt`, lower merges first) and the id of its result.
#[derive(Clone, Copy, Debug)]
pub struct Merge {
    /// The rank.
    pub rank: u32,
    /// The merged token.
    pub id: u32,
}

/// The merge table: a pair of token ids, `(first << 32) | second`, to its merge.
pub type MergeTable = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

/// The key of the pair `(a, b)` in a [`MergeTable`].
pub fn pair_key(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

/// A hasher for [`MergeTable`] keys: one folded 64×64→128-bit multiply.
// NB: BPE spends most of its time looking pairs up. Measured with `encode_speed` in
// tests/it/tokenizer.rs (best of 5, busy 2-core machine): with SipHash English encodes at 11-15 MB/s
// and Chinese at 7-8 MB/s; with this hasher at 27 and 26 MB/s. The keys come from the model file,
// which is trusted as much as its weights are.
#[derive(Default, Clone, Copy, Debug)]
pub struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        const K: u128 = 0x9E37_79B9_7F4A_7C15;
        let m = u128::from(x ^ self.0) * K;
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

/// The merge table and the ids of the 256 single-byte tokens.
#[derive(Clone, Debug)]
pub struct Bpe {
    merges: MergeTable,
    byte_ids: [u32; 256],
}

/// Reusable buffers for [`Bpe::encode_word`].
#[derive(Default, Debug)]
pub struct Scratch {
    word: Vec<u32>,
    next_word: Vec<u32>,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<(u32, u32)>>,
    pending: Vec<Reverse<(u32, u32)>>,
}

/// A symbol of the heap path: a token id in a doubly linked list over the word's byte positions.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NONE: u32 = u32::MAX;

/// Words up to this many bytes run the reference loop as written; longer ones use the heap.
// NB: the reference loop rescans every pair after each merge; it wins only on the shortest words.
// With 48 here Chinese text (long runs of letters) encoded at 4.4 MB/s, with 8 at 25 MB/s; English
// was the same within noise (`encode_speed` in tests/it/tokenizer.rs). The two paths are checked
// against each other in the tests below.
const SHORT_WORD: usize = 8;

impl Bpe {
    /// A BPE from its merge table (pair of ids → rank and result) and the single-byte token ids.
    pub fn new(merges: MergeTable, byte_ids: [u32; 256]) -> Bpe {
        Bpe { merges, byte_ids }
    }

    /// Appends the ids of `word` (the bytes of one pre-tokenized word) to `out`.
    pub fn encode_word(&self, word: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        match word.len() {
            0 => {}
            1 => out.push(self.byte_ids[word[0] as usize]),
            n if n <= SHORT_WORD => self.encode_short(word, out, scratch),
            _ => self.encode_long(word, out, scratch),
        }
    }

    fn rank(&self, a: u32, b: u32) -> Option<Merge> {
        self.merges.get(&pair_key(a, b)).copied()
    }

    /// The reference loop, as `GPT2Tokenizer.bpe` writes it.
    fn encode_short(&self, word: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch {
            word: cur,
            next_word: next,
            ..
        } = scratch;
        cur.clear();
        cur.extend(word.iter().map(|&b| self.byte_ids[b as usize]));
        while cur.len() >= 2 {
            let best = cur
                .windows(2)
                .filter_map(|w| self.rank(w[0], w[1]).map(|m| (m.rank, w[0], w[1], m.id)))
                .min_by_key(|m| m.0);
            let Some((_, a, b, merged)) = best else {
                break;
            };
            next.clear();
            let mut i = 0;
            while i < cur.len() {
                if cur[i] == a && cur.get(i + 1) == Some(&b) {
                    next.push(merged);
                    i += 2;
                } else {
                    next.push(cur[i]);
                    i += 1;
                }
            }
            std::mem::swap(cur, next);
        }
        out.extend_from_slice(cur);
    }

    /// The same loop on a heap of (rank, position) pairs.
    ///
    /// The reference merges all occurrences of the lowest-ranked pair in one left-to-right pass
    /// over the word as it was when the pass began. Here a pass pops that rank's entries in position
    /// order; a merge's new neighbour pairs wait in `pending` until the pass ends, because one of
    /// them may rank lower than the pass and must not be merged inside it. Ranks name pairs
    /// uniquely, and a merged token is longer than either half, so a pass never creates its own pair.
    fn encode_long(&self, word: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch {
            symbols,
            heap,
            pending,
            ..
        } = scratch;
        let n = word.len() as u32;
        symbols.clear();
        symbols.extend((0..n).zip(word).map(|(i, &b)| Symbol {
            id: self.byte_ids[b as usize],
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
            alive: true,
        }));
        heap.clear();
        pending.clear();
        for i in 0..symbols.len().saturating_sub(1) {
            if let Some(m) = self.rank(symbols[i].id, symbols[i + 1].id) {
                heap.push(Reverse((m.rank, i as u32)));
            }
        }
        let mut pass = NONE;
        loop {
            match heap.peek() {
                Some(&Reverse((rank, _))) if rank == pass => {}
                top => {
                    // The pass of rank `pass` is over: its new pairs join the heap.
                    if pending.is_empty() {
                        let Some(&Reverse((rank, _))) = top else {
                            break;
                        };
                        pass = rank;
                    } else {
                        heap.extend(pending.drain(..));
                        pass = NONE;
                        continue;
                    }
                }
            }
            let Some(Reverse((rank, pos))) = heap.pop() else {
                break;
            };
            let p = pos as usize;
            let Some(&left) = symbols.get(p) else {
                continue;
            };
            let Some(&right) = symbols.get(left.next as usize) else {
                continue;
            };
            if !left.alive {
                continue;
            }
            let Some(m) = self.rank(left.id, right.id).filter(|m| m.rank == rank) else {
                continue; // Stale: this position's pair changed since the entry was pushed.
            };
            let q = left.next as usize;
            symbols[q].alive = false;
            symbols[p].id = m.id;
            symbols[p].next = right.next;
            if let Some(after) = symbols.get_mut(right.next as usize) {
                after.prev = pos;
                if let Some(n) = self.rank(m.id, after.id) {
                    pending.push(Reverse((n.rank, pos)));
                }
            }
            if let Some(before) = symbols.get(left.prev as usize) {
                if let Some(n) = self.rank(before.id, m.id) {
                    pending.push(Reverse((n.rank, left.prev)));
                }
            }
        }
        let mut i = 0;
        while let Some(s) = symbols.get(i) {
            out.push(s.id);
            i = s.next as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn byte_map_is_gpt2s() {
        let chars = byte_chars();
        assert_eq!(chars[b'A' as usize], 'A');
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[0], 'Ā');
        assert_eq!(chars[0xAD], 'Ń');
        let dec = ByteDecoder::new();
        for (b, c) in (0u8..=255).zip(chars) {
            assert_eq!(dec.byte(c), Some(b));
        }
        assert_eq!(dec.byte(' '), None);
        assert_eq!(dec.byte('\u{144}'), None);
    }

    /// A random merge table over a 4-letter alphabet, including merges whose halves rank after
    /// them (which trained tables never have, but hostile files may), so the heap path's pass
    /// boundaries matter.
    fn random_bpe(rng: &mut impl Rng) -> Bpe {
        let mut byte_ids = [0u32; 256];
        for (i, id) in byte_ids.iter_mut().enumerate() {
            *id = i as u32;
        }
        let mut tokens: Vec<u32> = (b'a'..=b'd').map(u32::from).collect();
        let mut merges = MergeTable::default();
        let mut next_id = 256;
        for _ in 0..rng.random_range(5..40) {
            let a = tokens[rng.random_range(0..tokens.len())];
            let b = tokens[rng.random_range(0..tokens.len())];
            if merges.contains_key(&pair_key(a, b)) {
                continue;
            }
            let rank = rng.random_range(0..1000);
            merges.insert(
                pair_key(a, b),
                Merge {
                    rank: rank * 64 + merges.len() as u32,
                    id: next_id,
                },
            );
            tokens.push(next_id);
            next_id += 1;
        }
        Bpe::new(merges, byte_ids)
    }

    #[test]
    fn heap_path_equals_reference_loop() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let mut scratch = Scratch::default();
        for _ in 0..300 {
            let bpe = random_bpe(&mut rng);
            for _ in 0..20 {
                let len = rng.random_range(2..200);
                let word: Vec<u8> = (0..len).map(|_| b"abcd"[rng.random_range(0..4)]).collect();
                let (mut short, mut long) = (Vec::new(), Vec::new());
                bpe.encode_short(&word, &mut short, &mut scratch);
                bpe.encode_long(&word, &mut long, &mut scratch);
                assert_eq!(short, long, "{:?}", String::from_utf8_lossy(&word));
            }
        }
    }
}
