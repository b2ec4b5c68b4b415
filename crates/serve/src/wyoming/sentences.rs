//! Streamed text cut into sentences for Wyoming's `synthesize-chunk`.

/// Cuts complete sentences off streamed text, holding back the unfinished tail: a sentence ends
/// at `.`, `!`, `?`, `…` or `;` followed by white space, or at `。！？；` (which need none).
#[derive(Debug, Default)]
pub struct Sentences {
    tail: String,
}

impl Sentences {
    /// Adds `text`; returns the sentences it completed.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.tail.push_str(text);
        let mut out = Vec::new();
        loop {
            let chars: Vec<(usize, char)> = self.tail.char_indices().collect();
            let mut cut = None;
            for (k, &(i, c)) in chars.iter().enumerate() {
                if matches!(c, '。' | '！' | '？' | '；') {
                    cut = Some(i + c.len_utf8());
                    break;
                }
                if matches!(c, '.' | '!' | '?' | '…' | ';') {
                    if let Some(&(_, next)) = chars.get(k + 1) {
                        if next.is_whitespace() {
                            cut = Some(i + c.len_utf8());
                            break;
                        }
                    }
                }
            }
            let Some(at) = cut else { break };
            let sentence = self.tail[..at].trim().to_owned();
            self.tail = self.tail[at..].to_owned();
            if !sentence.is_empty() {
                out.push(sentence);
            }
        }
        out
    }

    /// The rest, at the end of the text.
    pub fn finish(&mut self) -> Option<String> {
        let t = std::mem::take(&mut self.tail);
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_owned())
    }

    /// Characters held.
    pub fn held(&self) -> usize {
        self.tail.chars().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_hold_back_the_tail() {
        let mut s = Sentences::default();
        assert!(s.push("Hel").is_empty());
        assert_eq!(s.push("lo there. How a"), vec!["Hello there."]);
        assert!(s.push("re you?").is_empty(), "no space after '?' yet");
        assert_eq!(s.finish().as_deref(), Some("How are you?"));
        assert_eq!(s.push("你好。再见"), vec!["你好。"]);
        assert_eq!(s.held(), 2);
        assert_eq!(s.push("3.5 km. Ok"), vec!["再见3.5 km."]);
    }
}
