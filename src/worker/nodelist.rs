//! SLURM's node lists (`SLURM_JOB_NODELIST`), expanded to node names: `node[01-03,07],login` is
//! `node01 node02 node03 node07 login`. A bracket holds numbers and ranges; a range keeps the
//! width of its first number (`[098-100]`: `098 099 100`); several brackets in one name give
//! every combination, the first bracket varying slowest (as `scontrol show hostnames` prints).

/// A node list SLURM would not have written.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("node list '{list}': {why}")]
pub struct NodelistError {
    pub list: String,
    pub why: String,
}

/// The most names one list may expand to: a typo such as `n[1-99999999]` is refused, not built.
const MAX_NODES: usize = 65_536;

/// The node names of `list`, in its order.
pub fn expand(list: &str) -> Result<Vec<String>, NodelistError> {
    let fail = |why: String| NodelistError {
        list: list.to_string(),
        why,
    };
    let mut nodes = vec![];
    for item in split_top_level(list).map_err(&fail)? {
        if item.is_empty() {
            return Err(fail("an empty name between commas".into()));
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let (prefix, after) = rest.split_at(rest.find('[').unwrap_or(rest.len()));
            names.iter_mut().for_each(|n| n.push_str(prefix));
            if after.is_empty() {
                break;
            }
            let close = after
                .find(']')
                .ok_or_else(|| fail(format!("'{item}' opens a bracket it does not close")))?;
            let numbers = numbers_of(&after[1..close]).map_err(&fail)?;
            if names.len().saturating_mul(numbers.len()) + nodes.len() > MAX_NODES {
                return Err(fail(format!("more than {MAX_NODES} nodes")));
            }
            names = names
                .iter()
                .flat_map(|n| numbers.iter().map(move |x| format!("{n}{x}")))
                .collect();
            rest = &after[close + 1..];
        }
        nodes.extend(names);
    }
    Ok(nodes)
}

/// `list` split at the commas outside brackets.
fn split_top_level(list: &str) -> Result<Vec<&str>, String> {
    let (mut items, mut depth, mut start) = (vec![], 0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("a bracket inside a bracket".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a ']' with no '[' before it".into()),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a bracket that is not closed".into());
    }
    items.push(&list[start..]);
    Ok(items)
}

/// The numbers of a bracket's inside, `01-03,07`, as text with their widths.
fn numbers_of(inside: &str) -> Result<Vec<String>, String> {
    let mut out = vec![];
    for range in inside.split(',') {
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let number = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!(
                    "'[{inside}]': '{range}' is not a number or a range"
                ));
            }
            s.parse::<u64>()
                .map_err(|_| format!("'[{inside}]': '{s}' is too large"))
        };
        let (a, b) = (number(lo)?, number(hi)?);
        if a > b {
            return Err(format!("'[{inside}]': the range '{range}' runs backwards"));
        }
        if (b - a) as usize >= MAX_NODES || out.len() + ((b - a) as usize) >= MAX_NODES {
            return Err(format!("more than {MAX_NODES} nodes"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|x| format!("{x:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every expected list is what SLURM 22.05's `scontrol show hostnames LIST` printed.
    #[test]
    fn lists_expand_as_slurm_expands_them() {
        assert_eq!(
            names("node[01-03,07],login"),
            ["node01", "node02", "node03", "node07", "login"]
        );
        assert_eq!(
            names("r[1-2]-n[08-10]"),
            ["r1-n08", "r1-n09", "r1-n10", "r2-n08", "r2-n09", "r2-n10"]
        );
        assert_eq!(names("gpu[8-10]"), ["gpu8", "gpu9", "gpu10"]);
        assert_eq!(names("x[098-100]"), ["x098", "x099", "x100"]);
        assert_eq!(names("n[001-2]"), ["n001", "n002"]);
        assert_eq!(names("a,b[3]"), ["a", "b3"]);
        assert_eq!(names("vm"), ["vm"]);
    }

    #[test]
    fn a_list_slurm_would_not_write_is_refused_naming_what_is_wrong() {
        for (list, why) in [
            ("bad[3-1]", "runs backwards"),
            ("bad[1-", "not closed"),
            ("bad]", "no '['"),
            ("n[1-x]", "is not a number"),
            ("n[[1]]", "inside a bracket"),
            ("a,,b", "empty name"),
            ("n[0-99999999]", "more than 65536 nodes"),
            ("n[0-999]m[0-999]", "more than 65536 nodes"),
        ] {
            let e = expand(list).expect_err(list);
            assert!(e.to_string().contains(why), "{list}: {e}");
            assert!(e.to_string().contains(list), "{list}: {e}");
        }
    }
}
