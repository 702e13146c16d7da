//! A bounded reader for the pickles inside `torch.save` archives (`data.pkl`).
//!
//! Only what a checkpoint needs is built: plain data (dicts, lists, tuples, str, numbers), class
//! references, calls (`REDUCE`, `NEWOBJ`) and persistent ids (tensor storages). Nothing is ever
//! executed. Unlike a general unpickler it has hard limits, because the bytes come from a file
//! the user points at: nesting depth, and the total number of values created (a memo entry
//! fetched twice is a copy here, so a small pickle could otherwise ask for exponential memory).
//!
//! The memo follows Python's sharing where it matters: a container is memoized when it is
//! created, still empty, and filled afterwards while it is on the stack; a later `BINGET` must
//! see it filled (`{'model': sd, 'ema': sd}` refers to one dict twice). So a memo entry points
//! at its object while that object is on the stack, and takes a copy of it when it leaves.
//!
//! `BUILD` (set an object's attributes) keeps the object and drops the state: for
//! `model.state_dict()`, an `OrderedDict` whose attribute `_metadata` holds per-module versions
//! (`torch.nn.Module.state_dict`), the attributes are not items of the dict.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Result};

/// Deepest nesting accepted (a state dict is 4 levels deep).
const MAX_DEPTH: u32 = 64;
/// Most values created, copies included (ViT-L's state dict pickle creates about 20 000).
const MAX_VALUES: u64 = 1 << 22;

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    /// Items in insertion order (a `dict` or `collections.OrderedDict`).
    Dict(Vec<(Value, Value)>),
    /// A reference to `module.name` (`GLOBAL`, `STACK_GLOBAL`).
    Global {
        module: String,
        name: String,
    },
    /// `func(*args)`, not executed.
    Call {
        func: Box<Value>,
        args: Box<Value>,
    },
    /// A persistent id: in `torch.save`, a tensor's storage.
    Persistent(Box<Value>),
}

impl Value {
    pub fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) => "dict",
            Value::Global { .. } => "class",
            Value::Call { .. } => "object",
            Value::Persistent(_) => "persistent id",
        }
    }

    pub fn is_global(&self, module: &str, name: &str) -> bool {
        matches!(self, Value::Global { module: m, name: n } if m == module && n == name)
    }
}

type Pairs = Vec<(Value, Value)>;

/// A value on the stack or in the memo, with its nesting depth and its size (values, and a
/// string or bytes counted by its length, so that copies of a long one are paid for).
#[derive(Clone)]
struct Item {
    v: Value,
    depth: u32,
    size: u64,
    /// Set while memo entries point at this stack item (see the module comment).
    serial: Option<u64>,
}

impl Item {
    fn leaf(v: Value) -> Self {
        let size = match &v {
            Value::Str(s) => 1 + s.len() as u64 / 16,
            Value::Bytes(b) => 1 + b.len() as u64 / 16,
            _ => 1,
        };
        Item { v, depth: 1, size, serial: None }
    }
    fn new(v: Value, depth: u32, size: u64) -> Self {
        Item { v, depth, size, serial: None }
    }
}

enum Slot {
    /// The stack item with this serial.
    OnStack(u64),
    /// A copy taken when that item left the stack.
    Done(Item),
}

struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Item>,
    marks: Vec<usize>,
    memo: HashMap<u32, Slot>,
    /// The memo ids that point at each stack item, by serial.
    pointing: HashMap<u64, Vec<u32>>,
    serials: u64,
    created: u64,
}

/// Adds `n` to the values created so far, failing past the limit.
fn charge(created: &mut u64, n: u64) -> Result<()> {
    *created = created.saturating_add(n);
    if *created > MAX_VALUES {
        bail!("the pickle creates more than {MAX_VALUES} values: not a checkpoint");
    }
    Ok(())
}

/// Reads one pickle from `data` (which must end at or after its `STOP`).
pub fn parse(data: &[u8]) -> Result<Value> {
    let mut m = Machine { data, pos: 0, stack: Vec::new(), marks: Vec::new(), memo: HashMap::new(), pointing: HashMap::new(), serials: 0, created: 0 };
    loop {
        let at = m.pos;
        let op = m.take(1).map_err(|_| anyhow!("the pickle ends at byte {at} without its STOP opcode"))?[0];
        if m.step(op).map_err(|e| anyhow!("pickle opcode 0x{op:02x} at byte {at}: {e}"))? {
            break;
        }
    }
    let top = m.stack.pop().ok_or_else(|| anyhow!("the pickle is empty"))?;
    Ok(top.v)
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| anyhow!("needs {n} bytes at byte {}, the pickle has {}", self.pos, self.data.len().saturating_sub(self.pos)))?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn len(&mut self, n: u64) -> Result<usize> {
        usize::try_from(n).map_err(|_| anyhow!("length {n} is too large"))
    }
    fn string(&mut self, n: usize) -> Result<String> {
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| anyhow!("a string is not UTF-8"))
    }
    fn line(&mut self) -> Result<String> {
        let rest = &self.data[self.pos..];
        let n = rest.iter().position(|&b| b == b'\n').ok_or_else(|| anyhow!("a text argument has no end of line"))?;
        let s = self.string(n)?;
        self.pos += 1;
        Ok(s)
    }

    fn count(&mut self, n: u64) -> Result<()> {
        charge(&mut self.created, n)
    }

    fn push(&mut self, it: Item) -> Result<()> {
        if it.depth > MAX_DEPTH {
            bail!("values nested deeper than {MAX_DEPTH} levels: not a checkpoint");
        }
        self.count(1)?;
        self.stack.push(it);
        Ok(())
    }
    fn push_leaf(&mut self, v: Value) -> Result<()> {
        self.push(Item::leaf(v))
    }
    fn pop(&mut self) -> Result<Item> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            bail!("pops past a MARK");
        }
        let it = self.stack.pop().ok_or_else(|| anyhow!("pops an empty stack"))?;
        self.leaving(&it)?;
        Ok(it)
    }

    /// An item leaves the stack: memo entries that point at it take a copy.
    fn leaving(&mut self, it: &Item) -> Result<()> {
        let Some(serial) = it.serial else { return Ok(()) };
        for id in self.pointing.remove(&serial).unwrap_or_default() {
            if matches!(self.memo.get(&id), Some(Slot::OnStack(x)) if *x == serial) {
                self.count(it.size)?;
                self.memo.insert(id, Slot::Done(Item { serial: None, ..it.clone() }));
            }
        }
        Ok(())
    }
    fn top(&mut self) -> Result<&mut Item> {
        if self.marks.last().is_some_and(|&m| m >= self.stack.len()) {
            bail!("reads past a MARK");
        }
        self.stack.last_mut().ok_or_else(|| anyhow!("reads an empty stack"))
    }
    fn pop_mark(&mut self) -> Result<Vec<Item>> {
        let m = self.marks.pop().ok_or_else(|| anyhow!("no MARK to pop to"))?;
        let items = self.stack.split_off(m.min(self.stack.len()));
        for it in &items {
            self.leaving(it)?;
        }
        Ok(items)
    }

    /// A container of `items`.
    fn container(items: Vec<Item>, make: impl FnOnce(Vec<Value>) -> Value) -> Item {
        let depth = 1 + items.iter().map(|i| i.depth).max().unwrap_or(0);
        let size = 1 + items.iter().map(|i| i.size).sum::<u64>();
        Item::new(make(items.into_iter().map(|i| i.v).collect()), depth, size)
    }

    /// Key-value pairs from alternating items, with their depth and size.
    fn pairs(items: Vec<Item>) -> Result<(Pairs, u32, u64)> {
        if !items.len().is_multiple_of(2) {
            bail!("an odd number of values for a dict");
        }
        let depth = items.iter().map(|i| i.depth).max().unwrap_or(0);
        let size = items.iter().map(|i| i.size).sum::<u64>();
        let mut it = items.into_iter();
        let mut out = Vec::new();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            out.push((k.v, v.v));
        }
        Ok((out, depth, size))
    }

    fn extend_dict(&mut self, items: Vec<Item>) -> Result<()> {
        let (pairs, depth, size) = Self::pairs(items)?;
        let top = self.top()?;
        let Value::Dict(d) = &mut top.v else { bail!("sets items on a {}", top.v.kind()) };
        d.extend(pairs);
        top.depth = top.depth.max(depth + 1);
        top.size += size;
        if top.depth > MAX_DEPTH {
            bail!("values nested deeper than {MAX_DEPTH} levels: not a checkpoint");
        }
        Ok(())
    }

    fn extend_list(&mut self, items: Vec<Item>) -> Result<()> {
        let depth = items.iter().map(|i| i.depth).max().unwrap_or(0);
        let size = items.iter().map(|i| i.size).sum::<u64>();
        let top = self.top()?;
        let Value::List(l) = &mut top.v else { bail!("appends to a {}", top.v.kind()) };
        l.extend(items.into_iter().map(|i| i.v));
        top.depth = top.depth.max(depth + 1);
        top.size += size;
        if top.depth > MAX_DEPTH {
            bail!("values nested deeper than {MAX_DEPTH} levels: not a checkpoint");
        }
        Ok(())
    }

    fn memo_put(&mut self, id: u32) -> Result<()> {
        self.count(1)?;
        let next = self.serials + 1;
        let top = self.top()?;
        let serial = *top.serial.get_or_insert(next);
        self.serials = self.serials.max(serial);
        self.memo.insert(id, Slot::OnStack(serial));
        self.pointing.entry(serial).or_default().push(id);
        Ok(())
    }

    fn memo_get(&mut self, id: u32) -> Result<()> {
        // Paid for before the copy is made.
        let it = match self.memo.get(&id).ok_or_else(|| anyhow!("memo entry {id} was never stored"))? {
            Slot::Done(it) => {
                charge(&mut self.created, it.size)?;
                it.clone()
            }
            Slot::OnStack(serial) => {
                // Still being filled: the object is on the stack (searching it is paid for too).
                let steps = self.stack.iter().rev().position(|it| it.serial == Some(*serial));
                let steps = steps.ok_or_else(|| anyhow!("memo entry {id} refers to a value that is gone"))?;
                let at = self.stack.len() - 1 - steps;
                charge(&mut self.created, steps as u64 + self.stack[at].size)?;
                Item { serial: None, ..self.stack[at].clone() }
            }
        };
        self.push(it)
    }

    fn call(&mut self, func: Item, args: Item) -> Result<Item> {
        // `OrderedDict()` and `OrderedDict([(k, v), ...])` are plain dicts to us.
        if func.v.is_global("collections", "OrderedDict") {
            match args.v {
                Value::Tuple(a) if a.is_empty() => return Ok(Item::leaf(Value::Dict(Vec::new()))),
                Value::Tuple(mut a) if a.len() == 1 => {
                    if let Value::List(pairs) = a.pop().unwrap() {
                        let mut d = Vec::with_capacity(pairs.len());
                        for p in pairs {
                            match p {
                                Value::Tuple(mut kv) | Value::List(mut kv) if kv.len() == 2 => {
                                    let v = kv.pop().unwrap();
                                    d.push((kv.pop().unwrap(), v));
                                }
                                _ => bail!("OrderedDict() given something other than (key, value) pairs"),
                            }
                        }
                        return Ok(Item::new(Value::Dict(d), args.depth, args.size));
                    }
                    bail!("OrderedDict() given something other than a list of pairs");
                }
                _ => bail!("OrderedDict() called with unexpected arguments"),
            }
        }
        Ok(Item::new(Value::Call { func: Box::new(func.v), args: Box::new(args.v) }, 1 + func.depth.max(args.depth), 1 + func.size + args.size))
    }

    /// Runs one opcode; true at `STOP`.
    fn step(&mut self, op: u8) -> Result<bool> {
        match op {
            b'.' => return Ok(true),
            0x80 => {
                let proto = self.u8()?;
                if proto > 5 {
                    bail!("pickle protocol {proto} is unknown");
                }
            }
            0x95 => {
                self.u64()?; // FRAME: a length hint only
            }
            b'(' => {
                self.count(1)?;
                self.marks.push(self.stack.len())
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let size = self.top()?.size;
                self.count(size)?;
                let it = Item { serial: None, ..self.top()?.clone() };
                self.push(it)?;
            }
            b'N' => self.push_leaf(Value::None)?,
            0x88 => self.push_leaf(Value::Bool(true))?,
            0x89 => self.push_leaf(Value::Bool(false))?,
            b'J' => {
                let v = self.u32()? as i32;
                self.push_leaf(Value::Int(v as i64))?
            }
            b'K' => {
                let v = self.u8()?;
                self.push_leaf(Value::Int(v as i64))?
            }
            b'M' => {
                let v = self.u16()?;
                self.push_leaf(Value::Int(v as i64))?
            }
            0x8a => {
                let n = self.u8()? as usize;
                let b = self.take(n)?;
                if n > 8 {
                    bail!("an integer of {n} bytes is out of range");
                }
                let mut v: i64 = 0;
                for (i, &x) in b.iter().enumerate() {
                    v |= (x as i64) << (8 * i);
                }
                if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                    v -= 1i64 << (8 * n);
                }
                self.push_leaf(Value::Int(v))?
            }
            b'G' => {
                let v = f64::from_be_bytes(self.take(8)?.try_into().unwrap());
                self.push_leaf(Value::Float(v))?
            }
            b'X' => {
                let n = self.u32()? as usize;
                let s = self.string(n)?;
                self.push_leaf(Value::Str(s))?
            }
            0x8c => {
                let n = self.u8()? as usize;
                let s = self.string(n)?;
                self.push_leaf(Value::Str(s))?
            }
            0x8d => {
                let n = self.u64()?;
                let n = self.len(n)?;
                let s = self.string(n)?;
                self.push_leaf(Value::Str(s))?
            }
            b'T' | b'B' => {
                let n = self.u32()? as usize;
                let b = self.take(n)?.to_vec();
                self.push_leaf(Value::Bytes(b))?
            }
            b'U' | b'C' => {
                let n = self.u8()? as usize;
                let b = self.take(n)?.to_vec();
                self.push_leaf(Value::Bytes(b))?
            }
            0x8e => {
                let n = self.u64()?;
                let n = self.len(n)?;
                let b = self.take(n)?.to_vec();
                self.push_leaf(Value::Bytes(b))?
            }
            b')' => self.push_leaf(Value::Tuple(Vec::new()))?,
            b't' => {
                let items = self.pop_mark()?;
                self.push(Self::container(items, Value::Tuple))?
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.pop()?);
                }
                items.reverse();
                self.push(Self::container(items, Value::Tuple))?
            }
            b']' => self.push_leaf(Value::List(Vec::new()))?,
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Self::container(items, Value::List))?
            }
            b'a' => {
                let it = self.pop()?;
                self.extend_list(vec![it])?
            }
            b'e' => {
                let items = self.pop_mark()?;
                self.extend_list(items)?
            }
            b'}' => self.push_leaf(Value::Dict(Vec::new()))?,
            b'd' => {
                let items = self.pop_mark()?;
                let (pairs, depth, size) = Self::pairs(items)?;
                self.push(Item::new(Value::Dict(pairs), depth + 1, size + 1))?
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                self.extend_dict(vec![k, v])?
            }
            b'u' => {
                let items = self.pop_mark()?;
                self.extend_dict(items)?
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.push_leaf(Value::Global { module, name })?
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (module.v, name.v) {
                    (Value::Str(module), Value::Str(name)) => self.push_leaf(Value::Global { module, name })?,
                    _ => bail!("STACK_GLOBAL needs two strings"),
                }
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let func = self.pop()?;
                let it = self.call(func, args)?;
                self.push(it)?
            }
            b'b' => {
                // The state (attributes) is dropped; see the module comment.
                self.pop()?;
                self.top()?;
            }
            b'Q' => {
                let id = self.pop()?;
                self.push(Item::new(Value::Persistent(Box::new(id.v)), id.depth + 1, id.size + 1))?
            }
            b'h' => {
                let id = self.u8()? as u32;
                self.memo_get(id)?
            }
            b'j' => {
                let id = self.u32()?;
                self.memo_get(id)?
            }
            b'q' => {
                let id = self.u8()? as u32;
                self.memo_put(id)?
            }
            b'r' => {
                let id = self.u32()?;
                self.memo_put(id)?
            }
            0x94 => {
                let id = u32::try_from(self.memo.len()).map_err(|_| anyhow!("memo overflow"))?;
                self.memo_put(id)?
            }
            _ => bail!("unsupported opcode (not something torch.save writes)"),
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_dict_with_attributes_keeps_only_its_items() {
        // OrderedDict() ; SETITEMS {'a': 1} ; BUILD {'_metadata': {}} : the state_dict shape.
        let mut p = vec![0x80, 2];
        p.extend_from_slice(b"ccollections\nOrderedDict\n)R");
        p.extend_from_slice(b"(X\x01\x00\x00\x00aK\x01u");
        p.extend_from_slice(b"}X\x09\x00\x00\x00_metadata}sb.");
        let v = parse(&p).unwrap();
        assert_eq!(v, Value::Dict(vec![(Value::Str("a".into()), Value::Int(1))]));
    }

    #[test]
    fn memo_copies_are_bounded() {
        // [] then 40 times: put, get, get, tuple2 -> a 2^40-value tree if copies were free.
        let mut p = vec![0x80, 2, b']'];
        for _ in 0..40 {
            p.extend_from_slice(&[b'q', 0, b'h', 0, 0x86]);
        }
        p.push(b'.');
        let e = parse(&p).unwrap_err().to_string();
        assert!(e.contains("more than") || e.contains("deeper"), "{e}");
    }

    #[test]
    fn a_memoized_container_is_seen_filled() {
        // d = {}; memo 0; d['a'] = 1; (d, d): Python's pickler writes the second as BINGET 0.
        let p = b"\x80\x02}q\x00X\x01\x00\x00\x00aK\x01sh\x00\x86.";
        let d = Value::Dict(vec![(Value::Str("a".into()), Value::Int(1))]);
        assert_eq!(parse(p).unwrap(), Value::Tuple(vec![d.clone(), d]));
        // Fetched while still on the stack, it is seen as it is then.
        let p = b"\x80\x02}q\x00h\x00\x86.";
        assert_eq!(parse(p).unwrap(), Value::Tuple(vec![Value::Dict(vec![]), Value::Dict(vec![])]));
    }

    #[test]
    fn copies_of_long_strings_are_paid_for() {
        // A 1 MB string, memoized, then fetched 3000 times: 3 GB if copies were free.
        let mut p = vec![0x80, 2, b'X'];
        p.extend_from_slice(&(1u32 << 20).to_le_bytes());
        p.extend(std::iter::repeat_n(b'a', 1 << 20));
        p.extend_from_slice(&[b'q', 0, b'0']);
        for _ in 0..3000 {
            p.extend_from_slice(&[b'h', 0]);
        }
        p.push(b'.');
        let e = parse(&p).unwrap_err().to_string();
        assert!(e.contains("more than"), "{e}");
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut p = vec![0x80, 2];
        p.extend(std::iter::repeat_n(b']', 100_000));
        p.extend(std::iter::repeat_n(b'a', 99_999));
        p.push(b'.');
        let e = parse(&p).unwrap_err().to_string();
        assert!(e.contains("deeper"), "{e}");
    }

    #[test]
    fn negative_long1_and_truncation() {
        let v = parse(&[0x80, 2, 0x8a, 2, 0xff, 0xff, b'.']).unwrap();
        assert_eq!(v, Value::Int(-1));
        let e = parse(&[0x80, 2, b'X', 9, 0, 0, 0, b'a']).unwrap_err().to_string();
        assert!(e.contains("needs 9 bytes"), "{e}");
        assert!(parse(&[0x80, 2, b'N']).unwrap_err().to_string().contains("without its STOP"));
    }
}
