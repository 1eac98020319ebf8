//! An operator schema as the shim describes it: argument names, types,
//! whether a default exists, and the return types. Parsed once per op at
//! binding time, so that every check happens in Rust before a kernel runs.

/// The base type of an argument or return.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Base {
    Tensor,
    Int,
    Float,
    Bool,
    Scalar,
    ScalarType,
    MemoryFormat,
    Layout,
    Device,
    Str,
    Generator,
    /// Anything else, by its TorchScript name.
    Other(String),
}

/// `base`, `base?`, `base[]`, `base?[]` or `base[]?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Type {
    pub(crate) base: Base,
    pub(crate) optional: bool,
    pub(crate) list: bool,
    pub(crate) elem_optional: bool,
}

impl Type {
    pub(crate) fn is_tensor(&self) -> bool {
        self.base == Base::Tensor
    }
}

impl std::fmt::Display for Type {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let base = match &self.base {
            Base::Tensor => "Tensor",
            Base::Int => "int",
            Base::Float => "float",
            Base::Bool => "bool",
            Base::Scalar => "Scalar",
            Base::ScalarType => "ScalarType",
            Base::MemoryFormat => "MemoryFormat",
            Base::Layout => "Layout",
            Base::Device => "Device",
            Base::Str => "str",
            Base::Generator => "Generator",
            Base::Other(s) => s,
        };
        let elem = if self.elem_optional { "?" } else { "" };
        let list = if self.list { "[]" } else { "" };
        let opt = if self.optional { "?" } else { "" };
        write!(f, "{base}{elem}{list}{opt}")
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Argument {
    pub(crate) name: String,
    pub(crate) ty: Type,
    pub(crate) has_default: bool,
    pub(crate) kwarg_only: bool,
    pub(crate) writes: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Schema {
    pub(crate) arguments: Vec<Argument>,
    pub(crate) returns: Vec<Type>,
    /// The schema as PyTorch prints it, for messages.
    pub(crate) text: String,
}

impl Schema {
    /// An `out=` variant: it writes a keyword-only argument.
    pub(crate) fn is_out_variant(&self) -> bool {
        self.arguments.iter().any(|a| a.kwarg_only && a.writes)
    }
}

fn flag(s: &str) -> Result<bool, String> {
    match s {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("bad flag {s:?} in a schema description")),
    }
}

fn parse_type(code: &str) -> Result<Type, String> {
    let parts: Vec<&str> = code.split('|').collect();
    let [base, opt, list, elem_opt] = parts[..] else {
        return Err(format!("bad type {code:?} in a schema description"));
    };
    let base = match base {
        "Tensor" => Base::Tensor,
        "int" => Base::Int,
        "float" => Base::Float,
        "bool" => Base::Bool,
        "Scalar" => Base::Scalar,
        "ScalarType" => Base::ScalarType,
        "MemoryFormat" => Base::MemoryFormat,
        "Layout" => Base::Layout,
        "Device" => Base::Device,
        "str" => Base::Str,
        "Generator" => Base::Generator,
        other => Base::Other(other.to_string()),
    };
    Ok(Type {
        base,
        optional: flag(opt)?,
        list: flag(list)?,
        elem_optional: flag(elem_opt)?,
    })
}

/// Parses the shim's description (see `tk_op_schema`).
pub(crate) fn parse(text: &str) -> Result<Schema, String> {
    let mut schema = Schema {
        arguments: Vec::new(),
        returns: Vec::new(),
        text: String::new(),
    };
    for line in text.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        match f[..] {
            ["arg", name, ty, has_default, kwarg_only, writes] => schema.arguments.push(Argument {
                name: name.to_string(),
                ty: parse_type(ty)?,
                has_default: flag(has_default)?,
                kwarg_only: flag(kwarg_only)?,
                writes: flag(writes)?,
            }),
            ["ret", ty, _writes] => schema.returns.push(parse_type(ty)?),
            ["schema", s] => schema.text = s.to_string(),
            _ => return Err(format!("bad line {line:?} in a schema description")),
        }
    }
    Ok(schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_description() {
        let s = parse(
            "arg\tself\tTensor|0|0|0\t0\t0\t0\narg\tweight\tTensor|1|0|0\t1\t1\t0\n\
             arg\tsize\tint|0|1|0\t0\t0\t0\nret\tTensor|0|0|0\t0\nschema\taten::x(Tensor self) -> Tensor\n",
        )
        .expect("valid description");
        assert_eq!(s.arguments.len(), 3);
        assert_eq!(s.arguments[1].ty.to_string(), "Tensor?");
        assert!(s.arguments[1].has_default && s.arguments[1].kwarg_only);
        assert_eq!(s.arguments[2].ty.to_string(), "int[]");
        assert_eq!(s.returns.len(), 1);
        assert_eq!(s.text, "aten::x(Tensor self) -> Tensor");
        assert!(!s.is_out_variant());
    }

    #[test]
    fn rejects_garbage() {
        assert!(parse("arg\tx\n").is_err());
        assert!(parse("arg\tx\tTensor|0|0\t0\t0\t0\n").is_err());
        assert!(parse("arg\tx\tTensor|0|0|2\t0\t0\t0\n").is_err());
    }
}
