"""Schemas, regexes and grammars shared by the xgrammar comparison test and the mask
benchmark. Each entry: (name, spec) with spec as structured_mask_tool takes it."""
import json

WEATHER_TOOL = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "City and country"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "include_hourly": {"type": "boolean"},
    },
    "required": ["location", "unit"],
}

PERSON_REFS = {
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "zip": {"type": "string", "pattern": "[0-9]{5}"}},
            "required": ["street", "zip"],
        },
        "person": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 40},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
                "address": {"$ref": "#/$defs/address"},
                "friends": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 3},
            },
            "required": ["name", "age"],
        },
    },
    "$ref": "#/$defs/person",
}

LONG_ENUM = {
    "type": "object",
    "properties": {
        "country": {"enum": [f"country_{i:03d}" for i in range(300)]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 5},
    },
    "required": ["country", "tags"],
}

MIXED = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "score": {"type": "number"},
        "kind": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
        "meta": {"type": "object", "additionalProperties": {"type": "integer"}},
        "const": {"const": "v1"},
    },
    "required": ["id", "score", "kind", "pair", "meta", "const"],
}

# What pydantic v2 writes (model_json_schema) for Literal fields, a str Enum, a discriminated
# union and float Field(ge=0, le=1) / Field(ge=0, lt=1) / confloat(gt=-2.5, le=3.75).
PYDANTIC_UNION = {
    "$defs": {
        "Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
                               "lives": {"maximum": 9, "minimum": 1, "title": "Lives", "type": "integer"}},
                "required": ["pet_type", "lives"], "title": "Cat", "type": "object"},
        "Dog": {"properties": {"pet_type": {"const": "dog", "title": "Pet Type", "type": "string"},
                               "bark": {"exclusiveMaximum": 1, "minimum": 0, "title": "Bark", "type": "number"}},
                "required": ["pet_type", "bark"], "title": "Dog", "type": "object"},
        "Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"},
    },
    "properties": {
        "pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}, "propertyName": "pet_type"},
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "title": "Pet"},
        "color": {"$ref": "#/$defs/Color"},
        "confidence": {"maximum": 1, "minimum": 0, "title": "Confidence", "type": "number"},
        "offset": {"exclusiveMinimum": -2.5, "maximum": 3.75, "title": "Offset", "type": "number"},
        "kind": {"enum": ["a", "b"], "title": "Kind", "type": "string"},
    },
    "required": ["pet", "color", "confidence", "offset", "kind"],
    "title": "Owner",
    "type": "object",
}

NUMBER_RANGES = {
    "type": "array",
    "prefixItems": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "number", "maximum": 10},
        {"type": "number", "minimum": -13.25, "exclusiveMaximum": -0.5},
        {"type": "number", "minimum": 0.125, "maximum": 120},
        {"type": "number", "exclusiveMaximum": 0},
    ],
    "items": False,
}

COUNTED_OBJECTS = {
    "type": "object",
    "properties": {
        "fixed": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "enum": ["u", "v"]},
                                                   "c": {"type": "boolean"}}, "minProperties": 2},
        "open": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                 "additionalProperties": {"type": "integer"}, "minProperties": 2, "maxProperties": 3},
        "few": {"type": "object", "properties": {"x": {"type": "null"}, "y": {"type": "null"}, "z": {"type": "null"}},
                "maxProperties": 1},
    },
    "required": ["fixed", "open", "few"],
}

# multipleOf without bounds only: xgrammar 0.2.8 ignores multipleOf next to a range (it warns
# "range + multipleOf combination not yet supported"), we enforce both (JsonNumbers.IntegerMultipleOfIsExact).
MULTIPLES = {
    "type": "array",
    "prefixItems": [
        {"type": "integer", "multipleOf": 7},
        {"type": "integer", "multipleOf": 12},
        {"type": "integer", "multipleOf": 1000},
    ],
    "minItems": 3,
    "items": False,
}

CORPUS = [
    ("schema_weather_tool", {"kind": "json_schema", "text": json.dumps(WEATHER_TOOL)}),
    ("schema_person_refs", {"kind": "json_schema", "text": json.dumps(PERSON_REFS), "explained": "length_strings"}),
    ("schema_long_enum", {"kind": "json_schema", "text": json.dumps(LONG_ENUM)}),
    ("schema_mixed", {"kind": "json_schema", "text": json.dumps(MIXED)}),
    ("schema_mixed_compact", {"kind": "json_schema", "text": json.dumps(MIXED), "any_whitespace": False}),
    ("schema_pydantic_union", {"kind": "json_schema", "text": json.dumps(PYDANTIC_UNION), "explained": "fraction_digits",
                               "steps": 60, "content_walk": True}),
    ("schema_pydantic_union_compact", {"kind": "json_schema", "text": json.dumps(PYDANTIC_UNION), "any_whitespace": False,
                                       "explained": "fraction_digits",
                               "steps": 60, "content_walk": True}),
    ("schema_number_ranges", {"kind": "json_schema", "text": json.dumps(NUMBER_RANGES), "explained": "fraction_digits",
                               "steps": 60, "content_walk": True}),
    ("schema_counted_objects", {"kind": "json_schema", "text": json.dumps(COUNTED_OBJECTS), "steps": 80,
                                "content_walk": True}),
    ("schema_counted_objects_compact", {"kind": "json_schema", "text": json.dumps(COUNTED_OBJECTS),
                                        "any_whitespace": False, "steps": 80}),
    ("schema_integer_multiples", {"kind": "json_schema", "text": json.dumps(MULTIPLES), "any_whitespace": False,
                                  "steps": 40}),
    ("json_object", {"kind": "json_object"}),
    ("regex_phone", {"kind": "regex", "text": r"\(\d{3}\) \d{3}-\d{4}"}),
    ("regex_classes", {"kind": "regex", "text": r"[A-Z][a-z]+( [A-Z][a-z]+)*, [^,\n]{1,20}\.?"}),
    ("regex_alternation", {"kind": "regex", "text": r"(yes|no|maybe)( because [a-z ]+)?"}),
    ("choice", {"kind": "choice", "choices": ["positive", "negative", "neutral", "mixed feelings"]}),
    ("grammar_arith", {"kind": "grammar", "text": 'root ::= expr\nexpr ::= term (("+" | "-") term)*\n'
                                                  'term ::= factor (("*" | "/") factor)*\n'
                                                  'factor ::= [0-9]+ | "(" expr ")"'}),
    ("grammar_list", {"kind": "grammar", "text": 'root ::= "- " item ("\\n- " item)*\nitem ::= [^\\n]+'}),
]
