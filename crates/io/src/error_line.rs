//! An error as both command lines print it: one line, each cause once.

use std::error::Error;

/// The error and its causes joined by ": ". A cause whose text the line
/// already shows (an error that quotes its source and also returns it from
/// `source()`) is left out, and so is a cause with no text.
///
/// Takes the chain's head as a `dyn Error`, so a binary passes an
/// `anyhow::Error` with `as_ref()`.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = String::new();
    for cause in std::iter::successors(Some(error), |&cause| cause.source()) {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;
    use std::error::Error;
    use std::fmt;

    /// An error with a fixed text and an optional source.
    #[derive(Debug)]
    struct Layer {
        text: &'static str,
        source: Option<Box<Layer>>,
    }

    impl fmt::Display for Layer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.text)
        }
    }

    impl Error for Layer {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.source
                .as_deref()
                .map(|layer| layer as &(dyn Error + 'static))
        }
    }

    /// `texts[0]` caused by `texts[1]`, caused by `texts[2]`, ...
    fn chain(texts: &[&'static str]) -> Layer {
        let innermost_first = texts.iter().rev();
        let head =
            innermost_first.fold(None, |source, &text| Some(Box::new(Layer { text, source })));
        *head.expect("at least one text")
    }

    #[test]
    fn a_lone_error_is_its_text() {
        assert_eq!(one_line(&chain(&["address in use"])), "address in use");
    }

    #[test]
    fn causes_are_joined_outermost_first() {
        let error = chain(&["listening on 127.0.0.1:5555", "address in use"]);
        assert_eq!(
            one_line(&error),
            "listening on 127.0.0.1:5555: address in use"
        );
    }

    #[test]
    fn a_cause_the_line_already_quotes_is_not_repeated() {
        let error = chain(&[
            "pushing a.txt",
            "reading config: No such file or directory",
            "No such file or directory",
        ]);
        assert_eq!(
            one_line(&error),
            "pushing a.txt: reading config: No such file or directory"
        );
    }

    #[test]
    fn causes_with_no_text_are_left_out() {
        let error = chain(&["", "connecting", "", "refused"]);
        assert_eq!(one_line(&error), "connecting: refused");
    }
}
