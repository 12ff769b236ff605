"""Example grammars in Lark syntax (used by the docs, tests and benchmarks): arithmetic with
nested parentheses and ignored spaces, a SQL SELECT subset, recursive lists with ignored
whitespace, and JSON (Lark's ``common`` terminals, ignored whitespace).

    from ctrlg.dfa.cfg.examples import EXAMPLES
    constraint = ctrlg.dfa.grammar(EXAMPLES["json"], tokenizer)
"""

__all__ = ["ARITHMETIC", "SQL", "LISTS", "JSON", "EXAMPLES", "SAMPLES"]

ARITHMETIC = r"""
?start: sum
?sum: product | sum ("+" | "-") product
?product: atom | product ("*" | "/") atom
?atom: NUMBER | "(" sum ")"
NUMBER: /[0-9]+/
%ignore " "
"""

SQL = r"""
start: "SELECT " columns " FROM " NAME where? ";"?
columns: "*" | NAME ("," " "? NAME)*
where: " WHERE " NAME " " OP " " value (" AND " NAME " " OP " " value)*
value: NUMBER | "'" /[a-z ]+/? "'"
OP: "=" | "<" | ">" | "<=" | ">=" | "!="
NAME: /[a-z_][a-z0-9_]*/
NUMBER: /[0-9]+/
"""

LISTS = r"""
start: list
list: "[" [item ("," item)*] "]"
?item: list | WORD
WORD: /[a-z]+/
%ignore /[ \n]+/
"""

JSON = r"""
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
start: value
?value: object | array | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: ESCAPED_STRING ":" value
%ignore WS
"""

EXAMPLES = {"arithmetic": ARITHMETIC, "sql": SQL, "lists": LISTS, "json": JSON}

#: A few sentences of each example grammar (benchmark walks, docs).
SAMPLES = {
    "arithmetic": ["(12 + 7) * 3", "((1 + 2) * (3 - 4)) / 5", "42", "7 * (8 + (9 - 1))"],
    "sql": ["SELECT name, age FROM users WHERE age > 30;", "SELECT * FROM orders",
            "SELECT id FROM items WHERE price <= 100 AND name = 'lamp';"],
    "lists": ["[apple, [pear, plum], []]", "[a, b, c]", "[[x], [y, [z]]]"],
    "json": ['{"name": "Ada", "tags": ["math", "code"], "age": 36}',
             '[1, 2.5, {"ok": true, "next": null}]', '{"a": {"b": {"c": [1, [2, [3]]]}}}'],
}
