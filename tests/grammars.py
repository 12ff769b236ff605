"""Test grammars shared by the grammar tests and benchmarks: arithmetic with nested parentheses,
a SQL SELECT subset, recursive lists, JSON — each in Lark syntax, with ``%ignore`` where noted."""

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

ALL = {"arithmetic": ARITHMETIC, "sql": SQL, "lists": LISTS, "json": JSON}
